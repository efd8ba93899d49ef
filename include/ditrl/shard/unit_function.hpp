#pragma once

// The autograd function of one wrap unit under the sharded-parameter manager.
// Forward: gather the unit, run it without recording, release it. Backward:
// gather it again, recompute it with grad from the saved inputs, reduce-
// scatter its parameter gradients, release it, return the input gradients.
// Without recompute (ShardOptions::recompute) the forward records the unit's
// graph and keeps it; resharding then frees only the gathered bytes, which
// the backward gathers back into the storage the graph's saved views hold.

#include <ditrl/models/unit.hpp>

#include <ATen/core/Tensor.h>

namespace ditrl::shard {

class ShardedParams;

// `anchor` requires grad, so that autograd records the call even when no
// input does.
models::Tensors run_with_backward(ShardedParams& params, size_t index, const models::Tensors& inputs,
                                  const models::UnitFn& fn, const at::Tensor& anchor);

}  // namespace ditrl::shard
