#pragma once

// DiffusionNFT (docs/algorithms.md §4). The rollout is pure ODE and keeps only x0;
// the trainer corrupts x0 at a sigma of the snapshot and contrasts the
// implicit positive and negative policies built from the trainable and the
// "old" (EMA) velocities:
//   r      = clamp(clamp(A, -C, C) / C / 2 + 0.5, 0, 1)
//   v_pos  = beta v + (1 - beta) v_old,   v_neg = (1 + beta) v_old - beta v
//   x0_pos = x_t - sigma v_pos,           x0_neg = x_t - sigma v_neg      (in v's dtype)
//   w      = clamp(mean_e |x0_branch - x0| in float64, min 1e-5), detached   (adaptive weighting)
//   L_branch = mean_e((x0_branch - x0)^2 / w)       (plain mean of squares without adaptive weighting)
//   L_pair = (r L_pos / beta + (1 - r) L_neg / beta) * C   [+ kl_beta mean_e((v - v_ref)^2)]

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::rl {

struct NftOptions {
  double beta = 1.0;
  double adv_clip_max = 5.0;  // C
  bool adaptive = true;
  double kl_beta = 0.0;  // optional velocity KL to a reference (NVlabs; off in miles by default)
};

struct NftTerms {
  at::Tensor loss_sum;  // scalar, differentiable: sum of L_pair
  at::Tensor per_pair;  // (B,)
  at::Tensor r;         // (B,) reward weight in [0, 1]
  at::Tensor pos_loss;  // (B,)
  at::Tensor neg_loss;  // (B,)
  at::Tensor kl;        // (B,) zeros unless kl_beta > 0
};

// The advantage -> [0, 1] weight r.
at::Tensor nft_reward_weight(const at::Tensor& advantages, double adv_clip_max);

// Forward process x_t = (1 - sigma) x0 + sigma eps; sigmas (B,) broadcast, fp32.
at::Tensor corrupt(const at::Tensor& x0, const at::Tensor& sigmas, const at::Tensor& noise);

// velocity, velocity_old: (B, ...) the trainable and the old-policy forward on x_t; x0, x_t: (B, ...);
// sigmas, advantages: (B,). velocity_ref is required when kl_beta > 0.
NftTerms nft_loss(const at::Tensor& velocity, const at::Tensor& velocity_old, const at::Tensor& x0,
                  const at::Tensor& x_t, const at::Tensor& sigmas, const at::Tensor& advantages,
                  const NftOptions& options, const at::Tensor& velocity_ref = {});

// K = max(1, int(num_sigmas * timestep_fraction)): a sample's NFT pairs.
int64_t nft_pairs_per_sample(int64_t num_sigmas, double timestep_fraction);

// Which sigma indices of a sample's snapshot become pairs (§4.1): K of
// them (nft_pairs_per_sample); with shuffle, the first K
// of randperm(num_sigmas) from a CPU generator seeded with
// stable_hash("nft_sigma_shuffle", seed, sample_index); else 0..K-1.
// num_sigmas counts the snapshot's sigmas without the terminal 0.
std::vector<int64_t> nft_sigma_indices(int64_t num_sigmas, double timestep_fraction, bool shuffle, int64_t seed,
                                       int64_t sample_index);

}  // namespace ditrl::rl
