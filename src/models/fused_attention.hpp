#pragma once

// LibTorch's fused SDPA kernels: flash on CPU tensors (its CPU kernel: tiled,
// deterministic, the same bits at any thread count), all three on CUDA ones.

#include <ditrl/models/attention.hpp>

#include <ATen/core/Tensor.h>

namespace ditrl::models {

// SDPA through exactly one of LibTorch's fused kernels (Flash, Efficient or
// Cudnn): a shape, dtype or mask that kernel cannot take is an error naming
// it, never a quiet fallback to another kernel. `mask` as in
// scaled_dot_product_attention.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           AttentionBackend backend);

}  // namespace ditrl::models
