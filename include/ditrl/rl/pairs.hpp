#pragma once

// Train pairs from a rank's rollout (docs/algorithms.md §3.2, §4.1, §5), in the
// order the trainer cuts into optimizer windows and micro-batches.
//
// Flow-GRPO order: the rank's samples in order, cut into micro-groups of
// `microgroup` samples; for each micro-group, for each trained step, the
// micro-group's samples. A micro-batch of `microgroup` pairs is then exactly
// one rollout forward (same samples, same step, same batch composition), so
// the training forward reproduces the rollout forward bit for bit. Windows of
// whole micro-groups keep every sample's pairs in one optimizer window.
//
// NFT and SFT order: sample-major, every pair of a sample adjacent.

#include <ditrl/rl/prepared_batch.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ditrl::rl {

// What pair building reads from a rank's rollout (N samples).
struct RolloutView {
  at::Tensor latents;                  // [N, K, ...] x_i for i in latent_steps
  std::vector<int64_t> latent_steps;   // sorted
  at::Tensor log_probs;                // [N, |S|] rollout log-prob of x_i -> x_{i+1}
  std::vector<int64_t> sde_steps;      // S, sorted
  at::Tensor final_latents;            // [N, ...] x_T
  at::Tensor advantages;               // [N]
  at::Tensor sample_index;             // [N] global sample ids
  std::shared_ptr<const diffusion::Schedule> snapshot;
};

// Pair.prompt_index is the sample's row in the rollout (its conditioning row).
std::vector<TrainPair> grpo_pairs(const RolloutView& rollout, int64_t microgroup);

// NFT: for every sample, K sigma indices (nft_sigma_indices, keyed by the
// global sample id); each pair corrupts the sample's x_T at that sigma.
std::vector<TrainPair> nft_pairs(const RolloutView& rollout, double timestep_fraction, bool shuffle, int64_t seed);

// Pair i of nft/sft pairs has its own forward-process noise, keyed by
// stable_hash(tag, seed, rollout_id, global sample id, step index), so the
// noise does not depend on ranks or micro-batches.
at::Tensor pair_noise(const char* tag, int64_t seed, int64_t rollout_id, const PreparedBatch& batch,
                      const std::vector<int64_t>& latent_shape);

// Where SFT pairs fall in the canonical micro-batch order (rl/loss_window.hpp).
struct SftRouting {
  int64_t micro_batch = 1;
  int64_t chunk_pairs = 1;  // pairs of one chunk
  int64_t num_windows = 1;
};

// SFT: `pairs_per_sample` grid indices drawn uniformly per sample from
// stable_hash("sample", seed, rollout_id, global sample id). With several
// experts (`expert_of_step[i]` = the expert of grid step i) every micro-batch
// trains one expert and draws only that expert's grid indices (docs/algorithms.md
// §5). The ranks run a window's micro-batches in lockstep and their gathers
// must match, at every rank count: the expert is picked by
// stable_hash("expert", seed, rollout_id, window, micro-batch of its chunk),
// what the micro-batches of one local step share at any rank count.
std::vector<TrainPair> sft_pairs(const RolloutView& rollout, int64_t pairs_per_sample, int64_t seed, int64_t rollout_id,
                                 const std::vector<size_t>& expert_of_step = {}, const SftRouting& routing = {});

}  // namespace ditrl::rl
