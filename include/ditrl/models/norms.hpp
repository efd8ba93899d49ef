#pragma once

// Normalisations of the four DiT families (docs/families.md §0.5). Where the
// rounding happens matters for bf16 parity, so each reference flavour is its
// own code path.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace ditrl::models {

// LayerNorm over the last dimension without affine parameters (SD3, Qwen,
// Wan, LTX norm_out): F.layer_norm in the input's dtype.
at::Tensor layer_norm(const at::Tensor& x, double eps);

// LayerNorm with optional affine parameters; `fp32` computes in fp32 and casts
// back to the input dtype (diffusers' FP32LayerNorm, Wan).
class LayerNorm : public torch::nn::Module {
 public:
  LayerNorm(int64_t dim, double eps, bool affine, bool fp32, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;

  at::Tensor weight;  // undefined without affine
  at::Tensor bias;

 private:
  int64_t dim_;
  double eps_;
  bool fp32_;
};

enum class RmsFlavour {
  // diffusers RMSNorm: statistic in fp32; with a bf16/fp16 weight the
  // normalised value is rounded to the weight dtype before the multiply; with
  // an fp32 weight the output stays fp32 (SD3.5 and Qwen q/k norms).
  Diffusers,
  // torch F.rms_norm (at::rms_norm): statistic in fp32 for half types, the
  // weight multiplied in fp32, one rounding to the input dtype (Wan and LTX
  // q/k norms, LTX weightless rms_norm).
  Torch,
};

// RMSNorm over the last dimension; `weight` may be undefined (weightless).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsFlavour flavour);

class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, RmsFlavour flavour, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const { return rms_norm(x, weight, eps_, flavour_); }

  at::Tensor weight;

 private:
  double eps_;
  RmsFlavour flavour_;
};

}  // namespace ditrl::models
