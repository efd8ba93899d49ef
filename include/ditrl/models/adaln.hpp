#pragma once

// Adaptive LayerNorm modulation (docs/families.md §0.7): AdaLN-Zero (a per-block
// linear on SiLU(temb) chunked into shift/scale/gate) and AdaLN-continuous
// (LN(x) * (1 + scale) + shift from a linear on SiLU(cond), scale first).

#include <ditrl/models/linear.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace ditrl::models {

// x * (1 + scale[:, None]) + shift[:, None] for x (B, L, D) and shift/scale (B, D).
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// `linear` [chunks*D, D] on SiLU(emb), returned as `chunks` (B, D) views in
// the checkpoint's row order (the family names them).
class AdaLayerNormZero : public torch::nn::Module {
 public:
  AdaLayerNormZero(int64_t dim, int64_t chunks, const at::TensorOptions& options);
  std::vector<at::Tensor> forward(const at::Tensor& emb) const;

  std::shared_ptr<Linear> linear;

 private:
  int64_t chunks_;
};

// diffusers AdaLayerNormContinuous with a LayerNorm without affine:
// (scale, shift) = chunk2(linear(SiLU(cond).to(x.dtype))); LN(x)*(1+scale)+shift.
class AdaLayerNormContinuous : public torch::nn::Module {
 public:
  AdaLayerNormContinuous(int64_t dim, int64_t cond_dim, double eps, const at::TensorOptions& options, bool bias = true);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cond) const;

  std::shared_ptr<Linear> linear;

 private:
  double eps_;
};

}  // namespace ditrl::models
