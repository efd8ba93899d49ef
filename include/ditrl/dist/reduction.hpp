#pragma once

// What the MPI and NCCL backends share about reductions: which dtype/op pairs
// are defined, the extremum of per-rank chunks (exact in any order), and the
// canonical summation tree of a deterministic sum.
//
// The canonical tree over n leaves [0, n) is T(n) = T(p) + T(n - p), with p
// the largest power of two below n (T(1) = the leaf). It is the tree a
// binary counter builds when leaves arrive one by one and the pending
// partial sums are folded from the right at the end (shard/tree_sum.hpp), so
// a sum can be cut anywhere at a node and continued elsewhere: a rank's
// local accumulation is a subtree and the cross-rank reduction the tree
// above it. A cross-rank sum places rank chunks on the leaves in
// chunk_leaf_order(): for a power-of-two rank count the bit-reversed rank,
// which is what makes the training step's gradient sum the same tree at
// every power-of-two rank count (rl/loss_window.hpp explains why).

#include <ditrl/dist/communicator.hpp>

#include <vector>

namespace ditrl::dist {

// Throws, naming `backend`, for bool or complex tensors and for Avg of integers.
void check_reducible(const char* backend, c10::ScalarType dtype, ReduceOp op);

// output = elementwise Max (or Min) of chunks[0], chunks[1], ...; chunks is
// [ranks, output.numel()], output contiguous.
void extremum_of_chunks(const at::Tensor& chunks, at::Tensor& output, ReduceOp op);

// p of T(n) = T(p) + T(n - p); n >= 2.
int64_t tree_split(int64_t n);

// order[p] = the rank whose chunk is leaf p of a cross-rank sum.
std::vector<int> chunk_leaf_order(int ranks);

// Bit reversal of `value` over `bits` bits.
int64_t bit_reversed(int64_t value, int bits);

// output = the canonical tree sum of chunks [ranks, output.numel()] over
// chunk_leaf_order(ranks), accumulated in fp32 for 16-bit floats (the dtype
// itself otherwise) and rounded once to output's dtype; / ranks for Avg.
// Any device (the NCCL backend's deterministic path; the MPI backend has a
// blocked CPU form of the same sum).
void tree_sum_of_chunks(const at::Tensor& chunks, at::Tensor& output, bool average);

}  // namespace ditrl::dist
