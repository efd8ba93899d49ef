#pragma once

// diffusers FeedForward with the GELU tanh approximation (docs/families.md §0.4):
// `net.0.proj` (dim -> inner), GELU-tanh, `net.2` (inner -> dim_out).

#include <ditrl/models/linear.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>

namespace ditrl::models {

class FeedForward : public torch::nn::Module {
 public:
  FeedForward(int64_t dim, int64_t inner, int64_t dim_out, bool bias, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;

  std::shared_ptr<Linear> proj;  // net.0.proj
  std::shared_ptr<Linear> out;   // net.2
};

}  // namespace ditrl::models
