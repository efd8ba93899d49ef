#include <ditrl/error.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/widened_gemm.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

namespace {
thread_local bool lora_disabled = false;
}

LoraDisableGuard::LoraDisableGuard() : previous_(lora_disabled) { lora_disabled = true; }
LoraDisableGuard::~LoraDisableGuard() { lora_disabled = previous_; }
bool LoraDisableGuard::active() { return lora_disabled; }

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (bias) this->bias = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  at::Tensor y = models::linear(x, weight, bias);
  if (!lora_A || lora_disabled) return y;
  const at::Tensor& a = lora_A->weight;
  const at::Tensor xa = x.scalar_type() == a.scalar_type() ? x : x.to(a.scalar_type());
  const at::Tensor delta = models::linear(models::linear(xa, a, {}), lora_B->weight, {}) * lora_scale_;
  return y + delta.to(y.scalar_type());
}

void Linear::attach_lora(int64_t rank, double alpha) {
  attach_lora(rank, alpha, weight.options());
}

void Linear::attach_lora(int64_t rank, double alpha, const at::TensorOptions& options) {
  if (has_lora()) fail("a LoRA adapter is already attached");
  if (rank <= 0) fail("LoRA rank must be positive, got {}", rank);
  lora_A = register_module("lora_A", std::make_shared<WeightOnly>(at::empty({rank, in_features()}, options)));
  lora_B = register_module("lora_B", std::make_shared<WeightOnly>(at::zeros({out_features(), rank}, options)));
  lora_alpha_ = alpha;
  lora_scale_ = alpha / static_cast<double>(rank);
  weight.set_requires_grad(false);
  if (bias.defined()) bias.set_requires_grad(false);
}

at::Tensor Linear::merged_weight() const {
  return merged_weight(weight.detach());
}

at::Tensor Linear::merged_weight(const at::Tensor& base) const {
  if (!has_lora()) return base.clone();
  const at::Tensor delta = at::matmul(lora_B->weight.detach().to(at::kFloat), lora_A->weight.detach().to(at::kFloat));
  return (base.to(at::kFloat) + delta * lora_scale_).to(base.scalar_type());
}

}  // namespace ditrl::models
