#pragma once

// LibTorch's fused SDPA kernels (CUDA build only; needs LibTorch >= 2.0).

#include <ATen/core/Tensor.h>

namespace ditrl::models {

// Flash (`flash` true) or memory-efficient SDPA over CUDA tensors; `mask` as
// in scaled_dot_product_attention.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool flash);

}  // namespace ditrl::models
