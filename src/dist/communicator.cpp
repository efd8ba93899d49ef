// Pending: the wait handle of an asynchronous collective.

#include <ditrl/dist/communicator.hpp>

#include <exception>

namespace ditrl::dist {

Pending& Pending::operator=(Pending&& other) noexcept {
  if (this != &other) {
    wait_quietly();
    wait_ = std::move(other.wait_);
    other.wait_ = nullptr;
  }
  return *this;
}

Pending::~Pending() {
  // While an error unwinds a peer may never arrive: the job is aborted by
  // main(), so nothing is waited for.
  if (std::uncaught_exceptions() == 0) wait_quietly();
}

void Pending::wait() {
  if (!wait_) return;
  const std::function<void()> wait = std::move(wait_);
  wait_ = nullptr;
  wait();
}

void Pending::wait_quietly() noexcept {
  try {
    wait();
  } catch (...) {
    // Reported by the next collective on the communicator.
  }
}

}  // namespace ditrl::dist
