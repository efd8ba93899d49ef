#pragma once

// LoRA adapters on the family's Linear layers (docs/families.md §0.9): targets are
// globs over module names with PEFT's suffix rule (`attn.to_q` matches
// `transformer_blocks.3.attn.to_q`), A drawn from a seed, B = 0, base frozen.
// Canonical names X.lora_A.weight / X.lora_B.weight; PEFT names on export.

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>

#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

namespace ditrl::models {

// True when `target` selects `module`: the glob matches the whole name or a
// dotted suffix of it.
bool lora_target_matches(const std::string& target, const std::string& module);

// Attaches adapters to every Linear a target selects (options.targets, or
// `default_targets` when empty) and freezes every other parameter. A target
// that selects no Linear is an error. Returns the adapted module names. The
// adapters are made like each base weight, or with `adapter_options` when given.
std::vector<std::string> attach_lora(torch::nn::Module& model, const LoraOptions& options,
                                     const std::vector<std::string>& default_targets,
                                     const std::optional<at::TensorOptions>& adapter_options = std::nullopt);

// The adapter tensors, under PEFT names (`base_model.model.X.lora_A.default.weight`)
// or canonical ones.
io::NamedTensors lora_state(const torch::nn::Module& model, bool peft_names);

// Loads adapter tensors (canonical or PEFT names) into attached adapters;
// every tensor must be an adapter of the model with the adapter's shape.
void load_lora(torch::nn::Module& model, const io::Checkpoint& checkpoint);

// Every base parameter and persistent buffer with the adapters folded in
// (W + alpha/r * B A): a full-weight checkpoint without LoRA names.
io::NamedTensors merged_state(const torch::nn::Module& model);

}  // namespace ditrl::models
