#pragma once

// This rank's slices of every flat group of a layout (shard/layout.hpp): the
// master values, AdamW moments and fp32 gradient accumulator of trainable
// groups, and the compute-dtype copy that units are gathered from (frozen
// groups: the compute slice only).

#include <ditrl/shard/layout.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ditrl::models {
class ParameterSource;
}

namespace ditrl::shard {

struct GroupSlices {
  at::Tensor compute;                            // [shard], aliases master when the dtypes agree
  at::Tensor master, exp_avg, exp_avg_sq, grad;  // [shard], trainable groups only
};

struct Slices {
  std::vector<std::vector<GroupSlices>> units;  // [unit][group], the layout's order
  c10::Device device = c10::kCPU;

  at::TensorOptions on(c10::ScalarType dtype) const;
};

// Takes the current values of the layout's materialised parameters
// (identical on every rank) and this rank's ranges of its meta parameters
// from `source` (sliced loading: no full tensor of them exists) as the slices
// on `device`, then points every parameter at an empty placeholder. A meta
// parameter the source does not supply is an error naming it.
Slices take_slices(const Layout& layout, int rank, c10::Device device, models::ParameterSource* source = nullptr);

// The part of a group's shard tensor holding elements `range` of `slot`
// (range from FlatGroup::owned_range for the same rank).
at::Tensor slot_part(const at::Tensor& shard_tensor, const FlatGroup& group, const Slot& slot, int rank,
                     std::pair<int64_t, int64_t> range);

// What a parameter holds while its unit is not gathered.
at::Tensor placeholder(c10::ScalarType dtype, c10::Device device);

}  // namespace ditrl::shard
