#pragma once

// A LoRA adapter apart from any model or file: the factors of each adapted
// Linear by its module path (`transformer_blocks.0.attn.to_q`), one rank and
// one alpha (the update is W + alpha/r * B A). This is what the file formats
// (lora_files.hpp) read and write and what a model's adapters are copied
// from and into.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::models {

struct LoraFactors {
  at::Tensor a;  // lora_A.weight [r, in]
  at::Tensor b;  // lora_B.weight [out, r]
};

struct LoraAdapter {
  int64_t rank = 0;
  double alpha = 0;
  std::map<std::string, LoraFactors> modules;  // module path -> factors

  double scale() const { return alpha / static_cast<double>(rank); }
  std::vector<std::string> module_names() const;  // sorted
  // The modules under `prefix` (`transformer_2.`) with the prefix removed:
  // one Wan2.2 expert's adapter, named as that expert's own checkpoint.
  LoraAdapter under(const std::string& prefix) const;
  // Checks the factors' shapes against rank (both factors, every module);
  // `source` names the adapter in the error.
  void validate(const std::string& source) const;
};

// The adapters attached to `model` (detached copies of nothing: the tensors
// are the model's own). Throws when the model has none.
LoraAdapter lora_adapter_of(const torch::nn::Module& model);

// Attaches adapters with the adapter's rank and alpha to exactly its modules
// (which must be Linear layers of the model without an adapter) and copies
// the factors in; every other parameter is frozen, as attach_lora does.
void attach_lora_adapter(torch::nn::Module& model, const LoraAdapter& adapter, const std::string& source);

// Copies the adapter into adapters the model already has (the deck's LoRA
// when a run starts from an existing adapter): rank, alpha and the set of
// adapted modules must be the model's; every difference is reported at once.
void load_lora_adapter(torch::nn::Module& model, const LoraAdapter& adapter, const std::string& source);

}  // namespace ditrl::models
