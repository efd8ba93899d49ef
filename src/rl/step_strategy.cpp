#include <ditrl/error.hpp>
#include <ditrl/rl/numpy_random.hpp>
#include <ditrl/rl/step_strategy.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

namespace ditrl::rl {

namespace {

StepSelection with_pair_latents(std::vector<int64_t> sde) {
  std::sort(sde.begin(), sde.end());
  std::set<int64_t> latents;
  for (int64_t s : sde) {
    latents.insert(s);
    latents.insert(s + 1);
  }
  return StepSelection{std::move(sde), std::vector<int64_t>(latents.begin(), latents.end())};
}

}  // namespace

StepSelection sde_window(int64_t num_steps, int64_t w, int64_t lo, int64_t hi, uint64_t seed) {
  if (w < 1) fail("sde_window: the window size (sde_steps) must be >= 1, got {}", w);
  if (!(0 <= lo && lo < hi && hi <= num_steps))
    fail("sde_window: window [{}, {}) must satisfy 0 <= lo < hi <= steps ({})", lo, hi, num_steps);
  if (w > hi - lo) fail("sde_window: window size {} exceeds the range [{}, {})", w, lo, hi);
  NumpyGenerator rng(seed);
  const int64_t start = rng.integers(lo, hi - w + 1);
  std::vector<int64_t> sde;
  for (int64_t i = start; i < start + w; ++i) sde.push_back(i);
  return with_pair_latents(std::move(sde));
}

StepSelection epoch_global_random_choice(int64_t num_steps, const std::vector<int64_t>& candidates, int64_t w,
                                         int64_t epoch, int64_t rollout_seed) {
  if (candidates.empty()) fail("epoch_global_random_choice: candidate_steps is required");
  if (w < 1) fail("epoch_global_random_choice: sde_steps must be >= 1, got {}", w);
  std::set<int64_t> seen;
  for (int64_t c : candidates) {
    if (c < 0 || c >= num_steps) fail("epoch_global_random_choice: candidate step {} is outside [0, {})", c, num_steps);
    if (!seen.insert(c).second) fail("epoch_global_random_choice: candidate step {} is listed twice", c);
  }
  const auto count = static_cast<int64_t>(candidates.size());
  if (w >= count) return with_pair_latents(candidates);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(epoch + rollout_seed));
  const at::Tensor perm = at::randperm(count, gen, at::kLong);
  std::vector<int64_t> sde;
  for (int64_t i = 0; i < w; ++i) sde.push_back(candidates[static_cast<size_t>(perm.data_ptr<int64_t>()[i])]);
  return with_pair_latents(std::move(sde));
}

StepSelection ode_and_return_last(int64_t num_steps) {
  if (num_steps < 1) fail("ode_and_return_last: steps must be >= 1, got {}", num_steps);
  return StepSelection{{}, {num_steps}};
}

StepSelection select_steps(const StepStrategyOptions& o, const SampleKey& sample) {
  switch (o.strategy) {
    case StepStrategy::SdeWindow: {
      if (!o.window.empty() && o.window.size() != 2)
        fail("sde_window: window must be [lo, hi), got {} entries", o.window.size());
      const int64_t lo = o.window.empty() ? 0 : o.window[0];
      const int64_t hi = o.window.empty() ? o.num_steps : o.window[1];
      return sde_window(o.num_steps, o.sde_steps, lo, hi, sample.seed);
    }
    case StepStrategy::EpochGlobalRandomChoice:
      if (o.rollout_batch_size < 1) fail("epoch_global_random_choice: rollout_batch_size must be >= 1");
      if (sample.group_index < 0) fail("epoch_global_random_choice: group_index must be >= 0");
      return epoch_global_random_choice(o.num_steps, o.candidate_steps, o.sde_steps,
                                        sample.group_index / o.rollout_batch_size, o.rollout_seed);
    case StepStrategy::OdeAndReturnLast:
      return ode_and_return_last(o.num_steps);
  }
  fail("no step strategy has value {}", static_cast<int>(o.strategy));
}

}  // namespace ditrl::rl
