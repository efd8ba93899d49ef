#pragma once

// Loss aggregation (algorithms.md §3.5, §8). Each rank cuts its contiguous
// shard of pairs into equal optimizer windows and each window into equal
// micro-batches. A micro-batch's loss formula returns the SUM over its pairs;
// the trainer backpropagates that sum divided by the number of pairs the rank
// owns in the current window, so the gradient accumulated over the window's
// micro-batches is the mean over the window's pairs, and the DP average of
// equal-sized rank windows is the mean over every pair of the global step.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::rl {

struct MicroBatch {
  int64_t begin = 0;  // pair range [begin, end) in the rank's shard
  int64_t end = 0;
};

struct OptimizerWindow {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<MicroBatch> micro_batches;
  int64_t pairs() const { return end - begin; }
};

// rank_pairs must split into num_windows equal windows and each window into
// micro-batches of micro_batch_size exactly (no ragged final micro-batch).
std::vector<OptimizerWindow> optimizer_windows(int64_t rank_pairs, int64_t num_windows, int64_t micro_batch_size);

// loss_sum / window_pairs: what one micro-batch backpropagates.
at::Tensor window_objective(const at::Tensor& loss_sum, int64_t window_pairs);

}  // namespace ditrl::rl
