#pragma once

// Loss aggregation and the canonical micro-batch order (docs/algorithms.md §3.5,
// §8), which makes a training step's sums the same at every power-of-two
// rank count.
//
// A rollout's samples fall into *chunks*: runs of consecutive samples whose
// pairs form whole micro-batches (GRPO: one rollout micro-group, each trained
// step one micro-batch; NFT/SFT: the fewest samples whose pairs fill whole
// micro-batches). Each rank holds a contiguous run of chunks (the rollout
// gives it a contiguous slice of the samples). Optimizer window w trains the
// chunks g with g mod W = w, so a window holds the same samples at any rank
// count. A micro-batch's loss returns the SUM over its pairs; the trainer
// backpropagates it divided by the rank's pairs in the window, so the
// gradient accumulated over the window is the mean over its pairs once the
// reduce-scatter averages the ranks.
//
// Inside a window of H chunks (H = q 2^c, q odd) of b micro-batches each,
// micro-batch i of chunk h = t q + u is leaf (i q + u) 2^c + bitrev_c(t) of
// the window's summation tree (dist/reduction.hpp). With N = 2^a ranks, rank
// r holds chunks h = r H/N + x, so at each local step the ranks hold the
// leaves of one aligned block of N, rank r at position bitrev_a(r): exactly
// the cross-rank sum's leaf order. Each rank runs its micro-batches in
// ascending leaf order, the reduce-scatter of a step sums one block (a node
// of the tree), and the rank accumulates the blocks with the same tree
// (shard/tree_sum.hpp): the window's gradient is the tree sum over its
// leaves whatever N. Rank counts that are not a power of two run the same
// order; their sums are deterministic but group differently.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::rl {

struct MicroBatch {
  int64_t begin = 0;  // pair range [begin, end) in the rank's pairs
  int64_t end = 0;
  int64_t leaf = 0;   // position in the window's summation tree, the same at every rank count
  int64_t index = 0;  // micro-batch of its chunk (the trained step, for GRPO)
};

struct OptimizerWindow {
  std::vector<MicroBatch> micro_batches;  // the rank's, in ascending leaf order (the order it runs them)
  int64_t rank_pairs = 0;                 // pairs of the rank in the window
  int64_t leaves = 0;                     // micro-batches of the window on all ranks
  int64_t pairs() const { return rank_pairs; }
};

struct WindowLayout {
  int64_t rank_pairs = 0;   // the rank's pairs, chunk after chunk
  int64_t chunk_pairs = 0;  // pairs of one chunk
  int64_t micro_batch = 1;  // pairs per micro-batch
  int64_t num_windows = 1;  // optimizer steps per rollout
  int rank = 0;
  int ranks = 1;
};

// The rank's chunks must split evenly into the windows and each chunk into
// micro-batches (no ragged final micro-batch).
std::vector<OptimizerWindow> optimizer_windows(const WindowLayout& layout);

// Samples per chunk for sample-major pairs (NFT, SFT): the fewest whose
// pairs_per_sample pairs each fill whole micro-batches.
int64_t chunk_samples(int64_t pairs_per_sample, int64_t micro_batch);

// loss_sum / window_pairs: what one micro-batch backpropagates.
at::Tensor window_objective(const at::Tensor& loss_sum, int64_t window_pairs);

}  // namespace ditrl::rl
