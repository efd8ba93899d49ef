#include <ditrl/models/norms.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

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
  return at::layer_norm(x.to(at::kFloat), {dim_}, precision::to_fp32(weight), precision::to_fp32(bias), eps_)
      .to(x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, RmsFlavour flavour) {
  if (flavour == RmsFlavour::Diffusers) {
    const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
    at::Tensor y = x * at::rsqrt(variance + eps);
    if (!weight.defined()) return y.to(x.scalar_type());
    if (precision::is_half(weight.scalar_type())) y = y.to(weight.scalar_type());
    return y * weight;
  }
  // The op the references call (F.rms_norm / nn.RMSNorm) on this LibTorch: for
  // half inputs it multiplies the weight in fp32 and rounds once.
  return at::rms_norm(x, {x.size(-1)}, weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt, eps);
}

RMSNorm::RMSNorm(int64_t dim, double eps, RmsFlavour flavour, const at::TensorOptions& options)
    : eps_(eps), flavour_(flavour) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

}  // namespace ditrl::models
