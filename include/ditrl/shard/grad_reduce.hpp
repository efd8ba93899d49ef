#pragma once

// Gradient reduction of one unit (docs/design.md §3): its parameters' gradients
// are flattened per trainable group in the group's reduce dtype, padded,
// reduce-scattered (averaged over the ranks) and added to this rank's fp32
// gradient slices, which accumulate over an optimizer step's micro-batches.
// On CUDA a group's reduce-scatter is left in flight (on the communicator's
// stream) while the backward of the units before it is issued; the next
// reduce or drain() adds it, so each slice still accumulates in call order.
//
// With `canonical` (deterministic mode) the micro-batches' reduced gradients
// are not added into the slice one after the other but through a TreeSum
// per group (shard/tree_sum.hpp), folded into the slices by settle(): the
// window's gradient is then the canonical tree over its micro-batches, the
// same at every power-of-two rank count (rl/loss_window.hpp). A unit must
// then be reduced once per micro-batch (its backward runs once).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/layout.hpp>
#include <ditrl/shard/slices.hpp>
#include <ditrl/shard/tree_sum.hpp>

#include <ATen/core/Tensor.h>

#include <vector>

namespace ditrl::shard {

class GradReducer {
 public:
  GradReducer(const Layout& layout, Slices& slices, dist::Communicator& comm, bool canonical);

  // grads: one per trainable parameter of the unit in layout order
  // (undefined = zero). Collective.
  void reduce(size_t unit, const std::vector<at::Tensor>& grads);
  // Adds the reduce-scatter still in flight, if any.
  void drain();
  // Ends a micro-batch's backward (drains; canonical: checks each unit was
  // reduced at most once in it).
  void end_micro_batch();
  // Before the slices are read: drains and, canonical, folds the trees into
  // the gradient slices; a slice nothing was added to since discard() is
  // zeroed now.
  void settle();
  // Zeroes the gradients (zero_grad): drops what was not settled and marks
  // every slice stale, so the first reduce into it overwrites instead of
  // adding (no pass that fills hundreds of MiB with zeros every step).
  void discard();
  // Wall seconds in reduce-scatters.
  double seconds() const { return seconds_; }

 private:
  struct InFlight {
    dist::Pending pending;
    at::Tensor mine;
    size_t unit = 0, group = 0;
    bool active = false;
  };

  void accumulate(size_t unit, size_t group, const at::Tensor& mine);
  // One rank: adds the unit's gradients grads[k...] of `group` to its slice
  // without the flat copy; advances k past the group's slots.
  void accumulate_in_place(size_t unit, size_t group, const std::vector<at::Tensor>& grads, size_t& k);
  bool in_place(const FlatGroup& group) const;

  bool overlap() const;
  at::Tensor buffer(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const;
  // Scratch reused across calls (see BufferPool).
  at::Tensor scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const;

  const Layout& layout_;
  Slices& slices_;
  dist::Communicator& comm_;
  bool canonical_;
  std::vector<std::vector<TreeSum>> trees_;  // [unit][group], canonical only
  std::vector<bool> reduced_;                // [unit]: reduced in the current micro-batch
  std::vector<std::vector<bool>> stale_;     // [unit][group]: the slice holds nothing since discard()
  // [unit][group][slot], for accumulate_in_place: views of the gradient
  // slice shaped as each parameter, made once (a narrow and a reshape per
  // parameter per micro-batch were a tiny model's largest share of ATen calls).
  std::vector<std::vector<std::vector<at::Tensor>>> parts_;
  at::Tensor flat_, mine_;
  InFlight in_flight_;
  double seconds_ = 0;
};

}  // namespace ditrl::shard
