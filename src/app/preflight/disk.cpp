// The write speed of out_dir, every rank at once.

#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/clock.hpp>

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace ditrl::app::preflight {

Local disk_speed(const std::string& out_dir, int rank, int64_t mib) {
  Local out;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  const std::string path = fmt::format("{}/.preflight-rank-{}-{}.tmp", out_dir, rank, getpid());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    out.passed = false;
    out.text = fmt::format("cannot create {}: {}", path, std::strerror(errno));
    return out;
  }
  std::vector<char> block(size_t{1} << 20, '\x5a');
  const auto start = Clock::now();
  std::string error;
  for (int64_t i = 0; i < mib && error.empty(); ++i)
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size()))
      error = fmt::format("write to {}: {}", path, std::strerror(errno));
  if (error.empty() && ::fsync(fd) != 0) error = fmt::format("fsync of {}: {}", path, std::strerror(errno));
  const double seconds = seconds_since(start);
  ::close(fd);
  std::filesystem::remove(path, ec);
  out.passed = error.empty();
  out.text = error.empty() ? fmt::format("{:.1f} MB/s ({} MiB written and fsynced in {:.3f} s)",
                                         static_cast<double>(mib) * 1.048576 / seconds, mib, seconds)
                           : error;
  return out;
}

}  // namespace ditrl::app::preflight
