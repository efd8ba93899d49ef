#include <ditrl/error.hpp>
#include <ditrl/rl/advantages.hpp>
#include <ditrl/rl/grpo_loss.hpp>

#include <ATen/ATen.h>

#include <vector>

namespace ditrl::rl {

at::Tensor grpo_kl(const KlInputs& kl) {
  if (!kl.mean_new.defined() || !kl.mean_ref.defined() || !kl.std_dev_t.defined())
    fail("grpo KL: mean_new, mean_ref and std_dev_t are all required");
  if (kl.mean_new.sizes() != kl.mean_ref.sizes() || kl.mean_new.dim() < 2)
    fail("grpo KL: mean_new {} and mean_ref {} must be equal (B, ...) shapes", fmt::join(kl.mean_new.sizes(), "x"),
         fmt::join(kl.mean_ref.sizes(), "x"));
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < kl.mean_new.dim(); ++d) dims.push_back(d);
  const at::Tensor per_pair =
      (kl.mean_new - kl.mean_ref).pow(2).mean(dims, /*keepdim=*/true) / (2 * kl.std_dev_t.pow(2));
  return per_pair.reshape({kl.mean_new.size(0)});
}

GrpoTerms grpo_loss(const at::Tensor& log_prob_new, const at::Tensor& log_prob_old, const at::Tensor& advantages,
                    const GrpoOptions& o, const KlInputs* kl) {
  if (!log_prob_new.defined() || log_prob_new.dim() != 1) fail("grpo loss: log_prob_new must be a (B,) tensor");
  const int64_t b = log_prob_new.size(0);
  for (const auto& [name, t] : {std::pair{"log_prob_old", log_prob_old}, std::pair{"advantages", advantages}})
    if (!t.defined() || t.dim() != 1 || t.size(0) != b) fail("grpo loss: {} must be ({},)", name, b);
  if (!(o.clip_range > 0)) fail("grpo loss: clip_range must be > 0, got {}", o.clip_range);

  GrpoTerms r;
  r.advantages = clamp_advantages(advantages, o.adv_clip_max);
  r.ratio = at::exp(log_prob_new - log_prob_old);
  const at::Tensor unclipped = -r.advantages * r.ratio;
  const at::Tensor clipped = -r.advantages * at::clamp(r.ratio, 1.0 - o.clip_range, 1.0 + o.clip_range);
  r.policy_loss = at::maximum(unclipped, clipped);
  r.loss_sum = r.policy_loss.sum();
  if (o.kl_beta > 0) {
    if (!kl) fail("grpo loss: kl_beta = {} needs the reference forward's transition means", o.kl_beta);
    r.kl = grpo_kl(*kl);
    if (r.kl.size(0) != b) fail("grpo loss: KL has {} pairs, the batch {}", r.kl.size(0), b);
    r.loss_sum = r.loss_sum + o.kl_beta * r.kl.sum();
  } else {
    r.kl = at::zeros_like(r.policy_loss).detach();
  }
  return r;
}

}  // namespace ditrl::rl
