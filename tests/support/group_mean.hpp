#pragma once

// The Ulysses suites' reference for a gradient: under sequence parallelism
// each rank's loss is one of its group's N equal terms (models/ulysses.hpp),
// so the unsplit model's gradient is the group's mean of the ranks' partial
// gradients, summed in rank order.

#include <ditrl/dist/communicator.hpp>

#include <ATen/ATen.h>

namespace ditrl::test {

inline at::Tensor group_mean(dist::Communicator& group, const at::Tensor& t) {
  at::Tensor sum = t.contiguous().clone();
  group.all_reduce(sum, dist::ReduceOp::Sum);
  return sum / static_cast<double>(group.size());
}

}  // namespace ditrl::test
