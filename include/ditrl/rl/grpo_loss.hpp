#pragma once

// Flow-GRPO per-pair objective (docs/algorithms.md §3.3-3.4):
//   ratio  = exp(logp_new - logp_old)
//   L_pair = max(-A * ratio, -A * clamp(ratio, 1 - eps_clip, 1 + eps_clip)),  A clamped to +-adv_clip_max
//   KL_pair = mean_e((mean_new - mean_ref)^2) / (2 * std_dev_t^2)   (std_dev_t without sqrt(-dt), as flow_grpo)
// loss_sum = sum L_pair + kl_beta * sum KL_pair over the micro-batch; the
// trainer backpropagates loss_sum / (pairs of the rank's optimizer window), see loss_window.hpp.

#include <ATen/core/Tensor.h>

namespace ditrl::rl {

struct GrpoOptions {
  double clip_range = 1e-4;
  double adv_clip_max = 5.0;
  double kl_beta = 0.0;
};

// The kernel outputs of the policy and of the reference forward on the same pairs.
struct KlInputs {
  at::Tensor mean_new;   // (B, ...) transition mean under the policy
  at::Tensor mean_ref;   // (B, ...) under the reference (no grad)
  at::Tensor std_dev_t;  // (B or 1, 1, ...) the policy kernel's std_dev_t
};

struct GrpoTerms {
  at::Tensor loss_sum;     // scalar, differentiable
  at::Tensor policy_loss;  // (B,) L_pair
  at::Tensor kl;           // (B,) KL_pair; zeros when kl_beta == 0
  at::Tensor ratio;        // (B,)
  at::Tensor advantages;   // (B,) clamped
};

// log_prob_new: (B,) with grad; log_prob_old, advantages: (B,). `kl` is
// required when kl_beta > 0 and ignored otherwise.
GrpoTerms grpo_loss(const at::Tensor& log_prob_new, const at::Tensor& log_prob_old, const at::Tensor& advantages,
                    const GrpoOptions& options, const KlInputs* kl = nullptr);

// KL_pair of §3.4 for each pair: (B,).
at::Tensor grpo_kl(const KlInputs& kl);

}  // namespace ditrl::rl
