#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ditrl {

// Every failure ditrl reports to a user is an Error whose message already
// carries its context (file, key, tensor, rank); main() prints it once.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A write the file system refused for want of space (ENOSPC, or EDQUOT: a
// quota): the I/O failure whose remedy is the user's, reported as such.
class DiskFull : public Error {
 public:
  using Error::Error;
};

inline bool no_space(int error) {
  return error == ENOSPC || error == EDQUOT;
}

// A failed write or sync whose errno is `error`; `what` names the operation.
[[noreturn]] inline void fail_write(int error, const std::string& what) {
  const std::string message = fmt::format("{}: {} (errno {})", what, std::strerror(error), error);
  if (no_space(error)) throw DiskFull(message);
  throw Error(message);
}

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ditrl
