#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/out_dir_lock.hpp>

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

namespace ditrl::io {

std::string this_host() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::optional<LockHolder> parse_lock_holder(const std::string& text) {
  const std::regex pattern(R"(^host (.+), PID (\d+),)");
  std::smatch m;
  if (!std::regex_search(text, m, pattern)) return std::nullopt;
  return LockHolder{m[1].str(), std::stoll(m[2].str())};
}

namespace {

std::string holder_text() {
  return fmt::format("host {}, PID {}, since {:%Y-%m-%d %H:%M:%S} UTC", this_host(), getpid(),
                     fmt::gmtime(std::chrono::system_clock::to_time_t(std::chrono::system_clock::now())));
}

std::string read_holder(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "it did not say which" : text;
}

// Rank 0's attempt: "" when it holds the lock (or runs unlocked), else the
// error every rank raises.
std::string try_lock(const std::string& out_dir, FileDescriptor& held) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return fmt::format("run.out_dir {}: cannot create it: {}", out_dir, ec.message());
  const std::string path = (std::filesystem::path(out_dir) / ".lock").string();
  FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) return fmt::format("run.out_dir {}: cannot open {}: {}", out_dir, path, std::strerror(errno));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return fmt::format(
          "run.out_dir {} is in use by another ditrl job ({}): two jobs writing one out_dir interleave its metrics "
          "and overwrite its checkpoints. Wait for that job, stop it, or set another run.out_dir",
          out_dir, read_holder(path));
    spdlog::warn("run.out_dir {}: this file system cannot lock {} ({}); nothing stops a second job from writing here",
                 out_dir, path, std::strerror(errno));
    return "";
  }
  const std::string holder = holder_text() + "\n";
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), holder.data(), holder.size(), 0) < 0)
    spdlog::warn("run.out_dir {}: could not record this job in {}: {}", out_dir, path, std::strerror(errno));
  held.reset(fd.release());
  return "";
}

}  // namespace

OutDirLock::OutDirLock(const std::string& out_dir, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string error = rank == 0 ? try_lock(out_dir, fd_) : "";
  int size = static_cast<int>(error.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, comm);
  error.resize(static_cast<size_t>(size));
  MPI_Bcast(error.data(), size, MPI_CHAR, 0, comm);
  if (!error.empty()) throw dist::AgreedError(error);
}

}  // namespace ditrl::io
