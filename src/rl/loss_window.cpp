#include <ditrl/dist/reduction.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/loss_window.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

namespace ditrl::rl {

namespace {

// H = q 2^c with q odd.
struct OddAndPower {
  int64_t odd = 1;
  int bits = 0;
};

OddAndPower split_powers_of_two(int64_t h) {
  OddAndPower out{h, 0};
  while (out.odd % 2 == 0) {
    out.odd /= 2;
    ++out.bits;
  }
  return out;
}

}  // namespace

std::vector<OptimizerWindow> optimizer_windows(const WindowLayout& l) {
  if (l.rank_pairs < 1 || l.num_windows < 1 || l.micro_batch < 1 || l.chunk_pairs < 1)
    fail("optimizer windows: pairs ({}), windows ({}), micro_batch ({}) and chunk pairs ({}) must all be >= 1",
         l.rank_pairs, l.num_windows, l.micro_batch, l.chunk_pairs);
  if (l.chunk_pairs % l.micro_batch != 0)
    fail("optimizer windows: a chunk's {} pairs are not a multiple of micro_batch {} (no ragged final micro-batch)",
         l.chunk_pairs, l.micro_batch);
  if (l.rank_pairs % l.chunk_pairs != 0)
    fail("optimizer windows: the rank's {} pairs are not whole chunks of {} pairs", l.rank_pairs, l.chunk_pairs);
  const int64_t rank_chunks = l.rank_pairs / l.chunk_pairs;
  if (rank_chunks % l.num_windows != 0)
    fail(
        "optimizer windows: the rank's {} chunks of {} pairs (whole micro-batches of whole samples) do not split "
        "into {} equal optimizer steps",
        rank_chunks, l.chunk_pairs, l.num_windows);
  const int64_t per_chunk = l.chunk_pairs / l.micro_batch;
  const int64_t rank_window_chunks = rank_chunks / l.num_windows;
  const int64_t window_chunks = rank_window_chunks * l.ranks;
  const OddAndPower hq = split_powers_of_two(window_chunks);

  std::vector<OptimizerWindow> windows(static_cast<size_t>(l.num_windows));
  for (int64_t x = 0; x < rank_chunks; ++x) {
    // The rank's chunks start at a multiple of the window count.
    OptimizerWindow& win = windows[static_cast<size_t>(x % l.num_windows)];
    const int64_t h = l.rank * rank_window_chunks + x / l.num_windows;
    const int64_t t = h / hq.odd, u = h % hq.odd;
    for (int64_t i = 0; i < per_chunk; ++i) {
      const int64_t begin = x * l.chunk_pairs + i * l.micro_batch;
      const int64_t leaf = ((i * hq.odd + u) << hq.bits) + dist::bit_reversed(t, hq.bits);
      win.micro_batches.push_back({begin, begin + l.micro_batch, leaf, i});
    }
  }
  for (OptimizerWindow& win : windows) {
    std::sort(win.micro_batches.begin(), win.micro_batches.end(),
              [](const MicroBatch& a, const MicroBatch& b) { return a.leaf < b.leaf; });
    win.rank_pairs = rank_window_chunks * l.chunk_pairs;
    win.leaves = window_chunks * per_chunk;
  }
  return windows;
}

int64_t chunk_samples(int64_t pairs_per_sample, int64_t micro_batch) {
  if (pairs_per_sample < 1 || micro_batch < 1)
    fail("chunk samples: pairs per sample ({}) and micro_batch ({}) must be >= 1", pairs_per_sample, micro_batch);
  return micro_batch / std::gcd(micro_batch, pairs_per_sample);
}

at::Tensor window_objective(const at::Tensor& loss_sum, int64_t window_pairs) {
  if (window_pairs < 1) fail("window objective: the window has {} pairs", window_pairs);
  if (!loss_sum.defined() || loss_sum.numel() != 1) fail("window objective: loss_sum must be a scalar");
  return loss_sum / static_cast<double>(window_pairs);
}

}  // namespace ditrl::rl
