#pragma once

// fp32 GEMMs through oneDNN's matmul (LibTorch's mkldnn::_linear_pointwise),
// for CPUs where it is faster than LibTorch's BLAS (precision/cpu_fp32_gemm.hpp).
// The backward's two GEMMs run through it too. Rows of a product do not
// depend on the other rows once it has 100 or more of them; below, oneDNN
// may pick another kernel for another row count (so does MKL below 4 rows),
// which is why rollout and training must cut their batches the same way.

#include <ATen/core/Tensor.h>

namespace ditrl::models {

// x W^T + b for fp32 CPU operands, differentiable in all three.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// a b for 2-D fp32 CPU operands of any strides; no autograd.
at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b);

}  // namespace ditrl::models
