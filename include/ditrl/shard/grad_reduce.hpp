#pragma once

// Gradient reduction of one unit (design.md §3): its parameters' gradients
// are flattened per trainable group in the group's reduce dtype, padded,
// reduce-scattered (averaged over the ranks) and added to this rank's fp32
// gradient slices, which accumulate over an optimizer step's micro-batches.
// On CUDA a group's reduce-scatter is left in flight (on the communicator's
// stream) while the backward of the units before it is issued; the next
// reduce or drain() adds it, so each slice still accumulates in call order.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/layout.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/core/Tensor.h>

#include <vector>

namespace ditrl::shard {

class GradReducer {
 public:
  GradReducer(const Layout& layout, Slices& slices, dist::Communicator& comm)
      : layout_(layout), slices_(slices), comm_(comm) {}

  // grads: one per trainable parameter of the unit in layout order
  // (undefined = zero). Collective.
  void reduce(size_t unit, const std::vector<at::Tensor>& grads);
  // Adds the reduce-scatter still in flight, if any (before the slices are read).
  void drain();
  // Wall seconds in reduce-scatters.
  double seconds() const { return seconds_; }

 private:
  struct InFlight {
    dist::Pending pending;
    at::Tensor mine;
    at::Tensor* target = nullptr;
  };

  bool overlap() const;
  at::Tensor buffer(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const;
  // Scratch reused across calls (see BufferPool).
  at::Tensor scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const;

  const Layout& layout_;
  Slices& slices_;
  dist::Communicator& comm_;
  at::Tensor flat_, mine_;
  InFlight in_flight_;
  double seconds_ = 0;
};

}  // namespace ditrl::shard
