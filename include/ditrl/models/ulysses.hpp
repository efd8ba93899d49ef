#pragma once

// Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv 2309.14509): the N
// ranks of a sequence group share one sample and each holds a contiguous 1/N
// of its tokens through the transformer blocks. Per-token work (projections,
// norms, modulation, RoPE, MLP, cross-attention queries) runs on the local
// tokens; at each self-attention an all-to-all swaps the token split for a
// head split, so every rank attends over the whole sequence with H/N heads,
// and a second all-to-all swaps back. The sequence is gathered once, after
// the last per-token layer.
//
// Gradients: every rank of the group computes the same loss from the
// gathered output, and the sharded parameters average gradients over all
// ranks, so each rank's loss is one of N equal terms: gather()'s backward is
// the all-gather's adjoint (the group's sum of the N equal output gradients:
// N times this rank's slice), shard()'s backward puts zeros at the other
// ranks' tokens, and each all-to-all's backward is the reverse all-to-all. A
// parameter's gradient on a rank is then N times the part that flows through
// its tokens; the group's sum is N times the unsplit forward's gradient (up
// to the order of the additions over tokens), so the world average equals
// the average over the world/N groups of unsplit samples.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::dist {
class Communicator;
}

namespace ditrl::models {

class Ulysses {
 public:
  // `group`: the ranks sharing the sample, in token order (rank r holds chunk r).
  explicit Ulysses(dist::Communicator& group);

  int size() const { return size_; }
  int rank() const { return rank_; }

  // Tokens per rank of a sequence of `tokens`; an error naming `what` unless
  // the group size divides it.
  int64_t local_tokens(int64_t tokens, const char* what) const;
  // An error unless the group size divides the attention's head count.
  void check_heads(int64_t heads, const char* what) const;

  // This rank's contiguous 1/N of dimension `dim`.
  at::Tensor shard(const at::Tensor& x, int64_t dim) const;
  // Every rank's x concatenated along `dim` in rank order.
  at::Tensor gather(const at::Tensor& x, int64_t dim) const;
  // (B, H, L/N, Dh) token split -> (B, H/N, L, Dh) head split, and back.
  at::Tensor tokens_to_heads(const at::Tensor& x) const;
  at::Tensor heads_to_tokens(const at::Tensor& x) const;

 private:
  dist::Communicator* group_;
  int size_ = 1;
  int rank_ = 0;
};

}  // namespace ditrl::models
