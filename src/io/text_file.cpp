#include <ditrl/error.hpp>
#include <ditrl/io/text_file.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ditrl::io {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create {}: {}", tmp, std::strerror(errno));
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      fail("cannot write {}: {}", tmp, std::strerror(errno));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail("cannot rename {} to {}: {}", tmp, path, ec.message());
  }
}

}  // namespace ditrl::io
