#pragma once

// Exact lookup into the rollout's schedule snapshot (docs/algorithms.md §6.3).
// A trained timestep t is matched by exact fp32 equality against the
// snapshot's timesteps; its sigma (and the next one) are read from the sigma
// snapshot at that index. There is no "t / 1000" fallback: the two arrays are
// computed separately and differ by ULPs, so a miss is an error that shows how
// far the value is from the nearest entries. A value matching two entries is an
// error too (diffusers' index_for_timestep would silently take the second).

#include <ditrl/diffusion/schedule.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::rl {

// The snapshot entries of a batch of queries, on the queries' device.
struct SnapshotEntries {
  at::Tensor indices;      // (B,) int64: step index i into the snapshot
  at::Tensor timesteps;    // (B,) fp32: timesteps[i]
  at::Tensor sigmas;       // (B,) fp32: sigmas[i]
  at::Tensor sigmas_next;  // (B,) fp32: sigmas[i + 1]
};

// Flow-GRPO/SFT: queries are trajectory timesteps t (1-D fp32).
SnapshotEntries lookup_sigmas(const diffusion::Schedule& snapshot, const at::Tensor& timesteps);

// NFT: queries are sigmas (1-D fp32) from the snapshot's non-terminal entries;
// the reverse lookup sigma -> index -> t.
SnapshotEntries lookup_timesteps(const diffusion::Schedule& snapshot, const at::Tensor& sigmas);

// Throws naming both samples and the first differing entry unless `other` is
// bitwise equal to `reference` (all samples of a batch share one snapshot).
void require_same_snapshot(const diffusion::Schedule& reference, int64_t reference_sample,
                           const diffusion::Schedule& other, int64_t sample);

// Signed distance from a to b in fp32 units in the last place (0 for equal values, +-0 alike).
int64_t ulp_distance(float a, float b);

}  // namespace ditrl::rl
