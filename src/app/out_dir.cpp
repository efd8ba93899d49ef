#include <ditrl/app/out_dir.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

namespace ditrl::app {

namespace {

namespace fs = std::filesystem;

// The folder that would receive out_dir's first new entry.
fs::path nearest_existing(const fs::path& out_dir) {
  fs::path dir = out_dir;
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
  return dir;
}

// Makes and removes a folder in `dir`; the error text, or "" when it worked.
std::string try_new_entry(const fs::path& dir) {
  std::string probe = (dir / ".ditrl-check-XXXXXX").string();
  if (!mkdtemp(probe.data())) return std::strerror(errno);
  ::rmdir(probe.c_str());
  return "";
}

// The path as a message can show it (a NUL would cut the message short).
std::string printable(const std::string& path) {
  std::string out;
  for (char ch : path) out += ch == '\0' ? std::string("\\0") : std::string(1, ch);
  return out;
}

}  // namespace

void check_out_dir(const config::Config& config) {
  const std::string& out = config.run.out_dir;
  auto refuse = [&](const std::string& why) {
    fail("{}: run.out_dir = \"{}\": {}", config.source, printable(out), why);
  };
  if (const size_t nul = out.find('\0'); nul != std::string::npos)
    refuse(fmt::format("holds a NUL character at byte {} (no file system takes one)", nul));
  const fs::path dir = fs::absolute(out);
  const fs::path base = nearest_existing(dir);
  if (!fs::is_directory(base)) refuse(fmt::format("{} is not a folder", base.string()));
  if (const std::string error = try_new_entry(base); !error.empty())
    refuse(fmt::format("{} does not take new entries: {}", base.string(), error));
  if (base != dir) return;
  for (const char* folder : {"logs", "checkpoints"})
    if (fs::exists(dir / folder) && !fs::is_directory(dir / folder))
      refuse(fmt::format("{} is not a folder, and the run writes its {} there", (dir / folder).string(), folder));
  for (const char* file : {"status", "metrics.h5", "checkpoints/latest", ".lock"})
    if (fs::exists(dir / file) && !fs::is_regular_file(dir / file))
      refuse(fmt::format("{} is not a regular file, and the run writes one there", (dir / file).string()));
}

}  // namespace ditrl::app
