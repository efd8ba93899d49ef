#pragma once

// A sum of tensors that arrive one at a time, grouped as the canonical tree
// of dist/reduction.hpp: a binary counter keeps one partial sum per complete
// subtree (two of equal size merge as they form), and fold() adds the
// pending partials from the right. The training step feeds it one
// reduce-scattered block of micro-batches per local step, so the window's
// gradient is the tree over its micro-batches at any power-of-two rank count
// (rl/loss_window.hpp). Holds at most log2(leaves) + 1 partials.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::shard {

class TreeSum {
 public:
  // Copies `leaf` (the caller may reuse it).
  void add(const at::Tensor& leaf);
  // out = the sum of every leaf added since the last fold (out untouched
  // when there was none); the buffers are kept for the next round.
  void fold_into(at::Tensor& out);
  // Drops the pending partials (their buffers are kept).
  void clear();
  bool empty() const { return pending_.empty(); }

 private:
  struct Partial {
    int64_t leaves = 0;
    at::Tensor sum;
  };
  at::Tensor fresh(const at::Tensor& like);

  std::vector<Partial> pending_;
  std::vector<at::Tensor> spare_;
};

}  // namespace ditrl::shard
