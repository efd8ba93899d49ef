#include <ditrl/error.hpp>
#include <ditrl/rl/loss_window.hpp>

#include <ATen/ATen.h>

namespace ditrl::rl {

std::vector<OptimizerWindow> optimizer_windows(int64_t rank_pairs, int64_t num_windows, int64_t micro_batch_size) {
  if (rank_pairs < 1 || num_windows < 1 || micro_batch_size < 1)
    fail("optimizer windows: pairs ({}), windows ({}) and micro_batch ({}) must all be >= 1", rank_pairs, num_windows,
         micro_batch_size);
  if (rank_pairs % num_windows != 0)
    fail("optimizer windows: the rank's {} pairs do not split into {} equal optimizer steps", rank_pairs, num_windows);
  const int64_t window_pairs = rank_pairs / num_windows;
  if (window_pairs % micro_batch_size != 0)
    fail(
        "optimizer windows: {} pairs per optimizer step are not a multiple of micro_batch {} (no ragged final "
        "micro-batch)",
        window_pairs, micro_batch_size);
  std::vector<OptimizerWindow> windows(static_cast<size_t>(num_windows));
  for (int64_t w = 0; w < num_windows; ++w) {
    OptimizerWindow& win = windows[static_cast<size_t>(w)];
    win.begin = w * window_pairs;
    win.end = win.begin + window_pairs;
    for (int64_t m = win.begin; m < win.end; m += micro_batch_size)
      win.micro_batches.push_back({m, m + micro_batch_size});
  }
  return windows;
}

at::Tensor window_objective(const at::Tensor& loss_sum, int64_t window_pairs) {
  if (window_pairs < 1) fail("window objective: the window has {} pairs", window_pairs);
  if (!loss_sum.defined() || loss_sum.numel() != 1) fail("window objective: loss_sum must be a scalar");
  return loss_sum / static_cast<double>(window_pairs);
}

}  // namespace ditrl::rl
