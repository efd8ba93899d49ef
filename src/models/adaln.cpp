#include <ditrl/models/adaln.hpp>
#include <ditrl/models/norms.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

AdaLayerNormZero::AdaLayerNormZero(int64_t dim, int64_t chunks, const at::TensorOptions& options) : chunks_(chunks) {
  linear = register_module("linear", std::make_shared<Linear>(dim, chunks * dim, true, options));
}

std::vector<at::Tensor> AdaLayerNormZero::forward(const at::Tensor& emb) const {
  return linear->forward(at::silu(emb)).chunk(chunks_, 1);
}

AdaLayerNormContinuous::AdaLayerNormContinuous(int64_t dim, int64_t cond_dim, double eps,
                                               const at::TensorOptions& options, bool bias)
    : eps_(eps) {
  linear = register_module("linear", std::make_shared<Linear>(cond_dim, 2 * dim, bias, options));
}

at::Tensor AdaLayerNormContinuous::forward(const at::Tensor& x, const at::Tensor& cond) const {
  const std::vector<at::Tensor> emb = linear->forward(at::silu(cond).to(x.scalar_type())).chunk(2, 1);
  return modulate(layer_norm(x, eps_), emb[1], emb[0]);
}

}  // namespace ditrl::models
