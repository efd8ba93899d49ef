#include <ditrl/dist/phase_timer.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>

namespace ditrl::dist {

c10::Event PhaseTimer::recorded() const {
  c10::Event event(device_.type(), c10::EventFlag::BACKEND_DEFAULT);  // the backend default keeps timing on
  event.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  return event;
}

void PhaseTimer::start() {
  if (device_.is_cpu())
    started_ = Clock::now();
  else
    open_.emplace(recorded());
}

void PhaseTimer::stop() {
  if (device_.is_cpu()) {
    total_ += seconds_since(started_);
  } else if (open_) {
    closed_.emplace_back(std::move(*open_), recorded());
    open_.reset();
  }
}

double PhaseTimer::seconds() {
  if (closed_.empty()) return total_;
  double milliseconds = 0;
  for (const auto& [begin, end] : closed_) {
    end.synchronize();
    milliseconds += begin.elapsedTime(end);
  }
  closed_.clear();
  total_ += milliseconds / 1000.0;
  return total_;
}

}  // namespace ditrl::dist
