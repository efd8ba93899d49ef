#include <ditrl/error.hpp>
#include <ditrl/rl/ema.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace ditrl::rl {

EmaShadow::EmaShadow(std::vector<at::Tensor> live, const EmaOptions& options)
    : live_(std::move(live)), options_(options) {
  if (live_.empty()) fail("EMA: no trainable tensors");
  for (const at::Tensor& t : live_) {
    if (!t.defined() || !t.is_floating_point()) fail("EMA: every tracked tensor must be a defined floating tensor");
    shadow_.push_back(t.detach().clone());
  }
}

double EmaShadow::decay_at(int64_t step) const {
  if (step <= options_.flat_steps) return options_.decay;
  return std::min(static_cast<double>(step - options_.flat_steps) * options_.ramp, options_.max);
}

double EmaShadow::update() {
  if (swapped_) fail("EMA: update called while the shadow is swapped in");
  ++step_;
  const double delta = decay_at(step_);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) shadow_[i].mul_(delta).add_(live_[i].detach(), 1.0 - delta);
  return delta;
}

void EmaShadow::swap() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < live_.size(); ++i) {
    const at::Tensor tmp = live_[i].detach().clone();
    live_[i].detach().copy_(shadow_[i]);
    shadow_[i].copy_(tmp);
  }
  swapped_ = !swapped_;
}

}  // namespace ditrl::rl
