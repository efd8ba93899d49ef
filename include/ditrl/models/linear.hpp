#pragma once

// The layers own their parameters directly (no torch::nn::Linear) so that a
// model can be built on the meta device and its named_parameters() are the
// checkpoint names: `X.weight`, `X.bias`, and with a LoRA adapter
// `X.lora_A.weight` [r, in] / `X.lora_B.weight` [out, r].

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

namespace ditrl::models {

// A module that is only a namespace in the parameter names (`to_out`, `net`).
class Container : public torch::nn::Module {};

// A module holding one `weight` (the two LoRA factors).
class WeightOnly : public torch::nn::Module {
 public:
  explicit WeightOnly(at::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  at::Tensor weight;
};

// While alive, every Linear skips its LoRA branch: the base model, which is
// the KL reference of a LoRA run.
class LoraDisableGuard {
 public:
  LoraDisableGuard();
  ~LoraDisableGuard();
  LoraDisableGuard(const LoraDisableGuard&) = delete;
  LoraDisableGuard& operator=(const LoraDisableGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options);

  // base(x) with bias first, then ((x A^T) B^T) * alpha/r cast to the output
  // dtype and added (PEFT order, docs/algorithms.md §9.5).
  at::Tensor forward(const at::Tensor& x) const;

  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }

  // Adds zero-initialised-B adapters (A drawn by the caller) and freezes the
  // base weight and bias; the adapters are trainable. They are made like the
  // base weight, or with `adapter_options` (a base on the meta device with
  // materialised adapters: sliced loading).
  void attach_lora(int64_t rank, double alpha);
  void attach_lora(int64_t rank, double alpha, const at::TensorOptions& adapter_options);
  bool has_lora() const { return lora_A != nullptr; }
  double lora_scale() const { return lora_scale_; }
  int64_t lora_rank() const { return has_lora() ? lora_A->weight.size(0) : 0; }
  double lora_alpha() const { return lora_alpha_; }
  // W + alpha/r * B A, in W's dtype (the full weight a merged export writes).
  at::Tensor merged_weight() const;
  // The same with `base` for W: a sliced model's W is on the meta device and
  // its values come from a ParameterSource (a streamed export).
  at::Tensor merged_weight(const at::Tensor& base) const;

  at::Tensor weight;
  at::Tensor bias;  // undefined without bias
  std::shared_ptr<WeightOnly> lora_A;
  std::shared_ptr<WeightOnly> lora_B;

 private:
  double lora_scale_ = 0;
  double lora_alpha_ = 0;
};

}  // namespace ditrl::models
