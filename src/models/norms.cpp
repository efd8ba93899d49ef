#include <ditrl/models/norms.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

namespace {
bool is_half(c10::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf;
}
}  // namespace

at::Tensor layer_norm(const at::Tensor& x, double eps) {
  return at::layer_norm(x, {x.size(-1)}, {}, {}, eps);
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool affine, bool fp32, const at::TensorOptions& options)
    : dim_(dim), eps_(eps), fp32_(fp32) {
  if (affine) {
    weight = register_parameter("weight", at::empty({dim}, options));
    bias = register_parameter("bias", at::empty({dim}, options));
  }
}

at::Tensor LayerNorm::forward(const at::Tensor& x) const {
  if (!fp32_) return at::layer_norm(x, {dim_}, weight, bias, eps_);
  const auto f32 = [](const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; };
  return at::layer_norm(x.to(at::kFloat), {dim_}, f32(weight), f32(bias), eps_).to(x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsFlavour flavour) {
  if (flavour == RmsFlavour::Diffusers) {
    const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
    at::Tensor y = x * at::rsqrt(variance + eps);
    if (!weight.defined()) return y.to(x.scalar_type());
    if (is_half(weight.scalar_type())) y = y.to(weight.scalar_type());
    return y * weight;
  }
  const at::Tensor xf = is_half(x.scalar_type()) ? x.to(at::kFloat) : x;
  at::Tensor y = (xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
  return weight.defined() ? y * weight : y;
}

RMSNorm::RMSNorm(int64_t dim, double eps, RmsFlavour flavour, const at::TensorOptions& options)
    : eps_(eps), flavour_(flavour) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

}  // namespace ditrl::models
