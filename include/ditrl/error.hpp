#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ditrl {

// Every failure ditrl reports to a user is an Error whose message already
// carries its context (file, key, tensor, rank); main() prints it once.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ditrl
