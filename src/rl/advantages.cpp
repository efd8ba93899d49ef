#include <ditrl/error.hpp>
#include <ditrl/rl/advantages.hpp>

#include <ATen/ATen.h>

namespace ditrl::rl {

at::Tensor group_advantages(const at::Tensor& rewards, const AdvantageOptions& o) {
  if (!rewards.defined() || rewards.dim() != 1 || !rewards.is_floating_point())
    fail("advantages: rewards must be a 1-D floating tensor");
  const int64_t n = rewards.size(0);
  if (o.group_size < 1 || n == 0 || n % o.group_size != 0)
    fail("advantages: {} rewards do not split into groups of {} samples per prompt", n, o.group_size);
  if (o.std_ddof != 0 && o.std_ddof != 1) fail("advantages: std_ddof must be 0 or 1, got {}", o.std_ddof);
  if (!(o.epsilon > 0)) fail("advantages: epsilon must be > 0, got {}", o.epsilon);
  const at::Tensor r = rewards.to(at::kDouble).cpu();
  const at::Tensor finite = at::isfinite(r);
  if (!finite.all().item<bool>())
    fail("advantages: reward of sample {} is not finite", at::argmin(finite.to(at::kInt)).item<int64_t>());

  const at::Tensor grouped = r.view({-1, o.group_size});
  const at::Tensor mean = o.global_mean ? r.mean() : grouped.mean(1, true);
  at::Tensor a = grouped - mean;
  if (o.std_normalization && o.group_size > 1) {
    const bool unbiased = o.std_ddof == 1;
    const at::Tensor std = o.global_std ? r.std(unbiased) : grouped.std({1}, unbiased, true);
    a = a / (std + o.epsilon);
  }
  return a.reshape({n}).to(at::kFloat).to(rewards.device());
}

at::Tensor clamp_advantages(const at::Tensor& advantages, double adv_clip_max) {
  if (!(adv_clip_max > 0)) fail("adv_clip_max must be > 0, got {}", adv_clip_max);
  return at::clamp(advantages, -adv_clip_max, adv_clip_max);
}

}  // namespace ditrl::rl
