#pragma once

// Seconds a phase of the run takes (forward, backward, optimizer, sampling),
// summed over the intervals between start() and stop(). On the CPU that is
// the wall clock. On a GPU the host returns from a kernel launch long before
// the kernel runs, so the intervals are timed by events recorded on the
// device's current stream: the device's time, with no host sync until the
// total is read (after the step's one device->host copy, when little is
// left to wait for).

#include <ditrl/clock.hpp>

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <optional>
#include <utility>
#include <vector>

namespace ditrl::dist {

class PhaseTimer {
 public:
  explicit PhaseTimer(c10::Device device) : device_(device) {}

  void start();
  void stop();
  // The closed intervals' total; on a GPU, waits for the last one to end.
  double seconds();

 private:
  c10::Event recorded() const;

  c10::Device device_;
  Clock::time_point started_;
  double total_ = 0;  // seconds of the intervals already summed
  std::optional<c10::Event> open_;
  std::vector<std::pair<c10::Event, c10::Event>> closed_;
};

// Times a scope into a PhaseTimer.
class TimedScope {
 public:
  explicit TimedScope(PhaseTimer& timer) : timer_(timer) { timer_.start(); }
  ~TimedScope() { timer_.stop(); }
  TimedScope(const TimedScope&) = delete;
  TimedScope& operator=(const TimedScope&) = delete;

 private:
  PhaseTimer& timer_;
};

}  // namespace ditrl::dist
