#pragma once

// at::linear and the patch embeddings' strided convolution, widened on a CPU
// where precision::cpu_half_gemm() says so: the bf16 / fp16 operands are
// converted to fp32, where their products are exact, the fp32 kernel
// (precision.cpu_fp32_gemm: MKL or oneDNN) sums them, and the result is
// rounded to the half dtype once. That is a half-precision GEMM with fp32
// accumulation, the semantics of oneDNN's and of GPU tensor-core GEMMs, with
// the sums in another order. The linear's
// autograd node keeps its inputs in the half dtype, so activation memory is
// that of the native path. fp32 CPU operands take the fp32 kernel the run
// chose (models/onednn_linear.hpp); CUDA operands take LibTorch's kernels.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::models {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
at::Tensor patch_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const std::vector<int64_t>& patch);

}  // namespace ditrl::models
