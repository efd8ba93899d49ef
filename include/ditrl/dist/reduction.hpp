#pragma once

// What the MPI and NCCL backends share about reductions: which dtype/op pairs
// are defined, and the extremum of per-rank chunks (exact in any order).

#include <ditrl/dist/communicator.hpp>

namespace ditrl::dist {

// Throws, naming `backend`, for bool or complex tensors and for Avg of integers.
void check_reducible(const char* backend, c10::ScalarType dtype, ReduceOp op);

// output = elementwise Max (or Min) of chunks[0], chunks[1], ...; chunks is
// [ranks, output.numel()], output contiguous.
void extremum_of_chunks(const at::Tensor& chunks, at::Tensor& output, ReduceOp op);

}  // namespace ditrl::dist
