#pragma once

// A parameter's values by canonical name, across the shards: this rank's
// piece of each parameter (for checkpoints), setting a parameter from its
// full value (weights, tests) and gathering it back whole.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/layout.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ditrl::shard {

// This rank's piece of one parameter: elements [begin, end) of the parameter
// flattened. The tensors are views into the slices: reading them saves,
// writing them loads (then re-cast the compute slices).
struct ShardPiece {
  std::string name;  // canonical
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
  bool trainable = true;
  at::Tensor master;      // master dtype; undefined when frozen
  at::Tensor exp_avg;     // fp32; undefined when frozen
  at::Tensor exp_avg_sq;  // fp32; undefined when frozen
  at::Tensor compute;     // compute dtype (aliases master where the dtypes agree)
};

// Layout order; parameters this rank owns no element of are left out.
std::vector<ShardPiece> pieces(const Layout& layout, Slices& slices, int rank);

// Sets a parameter's master (and compute slice) from its full value; local:
// every rank takes its own range.
void load_full(const Layout& layout, Slices& slices, int rank, const std::string& name, const at::Tensor& value);

// The full parameter in fp32 (from the masters; frozen: the compute slice).
// Collective: every rank calls it with the same name.
at::Tensor gather_full(const Layout& layout, const Slices& slices, dist::Communicator& comm, const std::string& name);

// Re-casts the compute slices of trainable groups from their masters.
void refresh_compute(Slices& slices);

}  // namespace ditrl::shard
