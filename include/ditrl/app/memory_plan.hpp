#pragma once

// `ditrl plan`'s prediction of a training run's peak resident memory per
// rank (what the run reports as perf/peak_rss_bytes): the process, the
// sharded parameter state, what loading, the rollout and the training step
// each add on top, and the largest of the three phases. Built from the
// deck's model on the meta device, so it runs without weights. The
// activation terms are models/activation_memory.hpp's; the constants and
// the measured margin are in benchmarks/results/real_size.md.

#include <ditrl/config/deck.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/shard/layout.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace ditrl::app {

// The process before any model (LibTorch, MPI, HDF5 and their threads): a
// tiny SD3 run peaks at 0.18-0.19 GB per rank at 1 and 2 ranks, of which the
// model is < 0.01 GB; `ditrl plan` alone peaks at 0.13 GB.
constexpr int64_t kProcessBaselineBytes = 180'000'000;

// cuBLAS workspaces on a GPU, taken from the CUDA caching allocator (its
// peak counts them): one per cuBLAS handle and stream, and a handle per
// thread that runs GEMMs, so two: the rank's main thread and autograd's
// device thread, which runs the backward. 32 MiB each is LibTorch 2.x's
// default on sm90 (H100/H200) and what deterministic mode's
// CUBLAS_WORKSPACE_CONFIG=:4096:8 gives on any GPU (LibTorch's
// CublasHandlePool.cpp; cuBLASLt shares it); other GPUs in fast mode take
// 8.1 MiB, so it over-counts 48 MiB there.
constexpr int64_t kCublasWorkspaceBytes = 2 * (int64_t{32} << 20);

struct MemoryPlan {
  // Resident through the whole run.
  int64_t baseline = kProcessBaselineBytes;
  int64_t state = 0;     // masters, moments, gradient accumulators, compute shards (shard::MemoryReport)
  int64_t buffers = 0;   // buffers the training model holds (SD3's pos_embed: the deck grid's crop only)
  int64_t adapters = 0;  // LoRA adapters, materialised whole on every rank before slicing (the allocator keeps them)
  int64_t shadows = 0;   // algorithm copies of the trainable masters (DiffusionNFT's EMA, a full-tune KL reference)
  // Loading: the largest parameter held whole at once (a seeded draw, fp32).
  int64_t load = 0;
  // Rollout and training.
  int64_t gathered = 0;      // gathered units at once (root + current + prefetched; every unit with keep_gathered)
  int64_t trajectories = 0;  // the rank's samples: kept latents, velocities, final latents, conditioning rows
  // A forward's copies of its conditioning (the text states dominate): the
  // training batch's rows, the CFG concatenation of positive and negative
  // (fp32), their cast to the forward dtype.
  int64_t rollout_inputs = 0, training_inputs = 0;
  models::ActivationEstimate rollout;   // one micro-group's no-grad forward (both CFG halves)
  models::ActivationEstimate training;  // one micro-batch's forward and recomputing backward
  int64_t unit_grads = 0;               // training: one unit's parameter gradients and gradient-reduce buffers
  bool activations_modelled = false;    // false: a family activation_memory does not know (counted as 0)

  int64_t resident() const { return baseline + state + buffers + adapters + shadows; }
  int64_t load_peak() const { return resident() + load; }
  int64_t rollout_peak() const { return resident() + gathered + trajectories + rollout_inputs + rollout.total(); }
  int64_t training_peak() const {
    return resident() + gathered + trajectories + training_inputs + training.total() + unit_grads;
  }
  int64_t peak() const;
  // On a GPU (run.device = cuda) the same terms less the process live on the
  // device, with the cuBLAS workspaces: the CUDA allocator's predicted peak
  // (perf/peak_device_bytes). On an H200 the quickstart peaked at 0.104 GB
  // against 0.015 GB predicted without the workspaces (0.082 GB with them,
  // not yet re-measured); full fine-tunes of SD3.5-medium and Wan2.1-1.3B at
  // 1.02x without them (benchmarks/results/real_size.md).
  int64_t device_peak() const { return on_device(peak()); }
  // A phase's peak as the GPU's allocator would see it.
  int64_t on_device(int64_t host_peak) const { return host_peak - baseline + kCublasWorkspaceBytes; }

  // The breakdown as `ditrl plan` prints it (GB = 10^9 bytes); the last
  // line is "# predicted peak per rank: X GB (N B)".
  std::string text() const;
};

// The deck's training run at `world_size` ranks. `family` is the sliced
// training model on the meta device (app::plan_family), `layout` its
// sharding at that world size.
MemoryPlan memory_plan(const config::Config& c, const models::Family& family, const shard::Layout& layout);

// The model `ditrl train` builds, on the meta device: sliced, with SD3's
// pos_embed cropped to the deck's grid.
std::shared_ptr<models::Family> plan_family(const config::Config& c);

}  // namespace ditrl::app
