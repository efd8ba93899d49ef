#pragma once

// LoRA adapter files in the formats the ecosystem loads as they are:
//
//  - PEFT: a folder with adapter_config.json (peft_type LORA, r, lora_alpha,
//    target_modules = the adapted module paths) and adapter_model.safetensors
//    with keys `base_model.model.<module>.lora_A.weight` (PEFT's saved form:
//    no adapter name). `PeftModel.from_pretrained(model, folder)` loads it.
//  - diffusers: pytorch_lora_weights.safetensors with keys
//    `transformer.<module>.lora_A.weight` and the LoraConfig as
//    `__metadata__["lora_adapter_metadata"]` (keys prefixed `transformer.`),
//    which is where `load_lora_weights` / `load_lora_adapter` read r and
//    lora_alpha (without it they take alpha = r, a different scale).
//  - LTX-2 (ltx_core's loader, ComfyUI layout): keys
//    `diffusion_model.<module>.lora_A.weight`; ltx_core fuses W + strength B A
//    with no alpha, so alpha/r is folded into lora_B (strength 1 reproduces
//    the trained model) and recorded in the metadata (ditrl_lora_alpha,
//    ditrl_lora_rank, ditrl_lora_b_scaled = "alpha/r").
//  - ComfyUI (its LoraLoader, comfy/lora.py): one `<key>.alpha` scalar
//    tensor beside each module's `<key>.lora_A.weight` / `.lora_B.weight`,
//    because ComfyUI reads no metadata and applies scale 1 to a module
//    without one; `<key>` is where ComfyUI's key map for the model looks:
//      sd3         `transformer.<module>`: ComfyUI maps the diffusers names
//                  onto its MMDiT (to_q/to_k/to_v onto slices of its fused
//                  qkv, which a rank-r factor pair cannot name directly);
//      flux        `transformer.<module>`, as sd3: ComfyUI's Flux key map
//                  (comfy/utils.py flux_to_diffusers) takes the diffusers
//                  names onto its fused qkv / linear1 slices;
//      qwen_image  `diffusion_model.<module>`: ComfyUI's Qwen-Image keeps
//                  the diffusers names;
//      wan         `diffusion_model.<Wan checkpoint name>`
//                  (blocks.N.self_attn.q, .cross_attn.o, .ffn.0,
//                  time_embedding.0, head.head, ...): ComfyUI has no
//                  diffusers names for Wan.
//      flux2       `diffusion_model.<BFL module>` (double_blocks.N.img_attn.qkv,
//                  single_blocks.N.linear1, ...): ComfyUI's FLUX.2 model
//                  keeps Black Forest Labs' names, and diffusers' Flux2
//                  loader reads this layout (ai-toolkit's). Adapted parts
//                  of a fused module share its factors: lora_A stacks
//                  theirs, lora_B holds each part's B in its rows and
//                  columns (zero elsewhere), so the module's rank is r per
//                  adapted part. No `.alpha` (diffusers' loader refuses
//                  one): lora_B holds (alpha/r) B, as LTX-2's file does.
//                  ditrl reads the export's other files, not this one.
//    LTX-2's ComfyUI file is the LTX-2 layout above (lora_B pre-scaled).
//    What ComfyUI's loader does with these files, by hand against its
//    repository: benchmarks/results/comfyui_lora.md.
//
// read_lora_file() takes any of these but FLUX.2's ComfyUI file (Wan checkpoint names come back as
// ditrl's; kohya-style per-module `.alpha` tensors are read); what it cannot
// represent (DoRA, per-module ranks or alphas, biases on lora_B,
// fan_in_fan_out) is an error naming the file.

#include <ditrl/models/lora_adapter.hpp>

#include <c10/core/ScalarType.h>

#include <map>
#include <string>

namespace ditrl::models {

enum class LoraFormat { Peft, Diffusers, Ltx };

struct LoraFileOptions {
  c10::ScalarType dtype = c10::ScalarType::Float;  // stored dtype of the factors
  std::string base_model;                          // base_model_name_or_path: a repo id (hub_repo_id), "" = null
  std::map<std::string, std::string> metadata;     // extra safetensors __metadata__ entries
};

// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors.
void write_peft_adapter(const std::string& dir, const LoraAdapter& adapter, const LoraFileOptions& options);
// Writes one safetensors file in the diffusers or the LTX-2 layout.
void write_lora_file(const std::string& path, LoraFormat format, const LoraAdapter& adapter,
                     const LoraFileOptions& options);
// Writes the ComfyUI file of `family` (sd3, wan, qwen_image, flux; LTX-2's is
// LoraFormat::Ltx). A module without a name in that layout is an error
// naming it.
void write_comfyui_lora(const std::string& path, const std::string& family, const LoraAdapter& adapter,
                        const LoraFileOptions& options);
// Whether write_comfyui_lora has a layout for `family`. FLUX.2 has none yet
// (ComfyUI's key map for it is unchecked), so its exports carry no ComfyUI file.
bool has_comfyui_lora_layout(const std::string& family);

// What adapter_config.json may say of base weights at `path`: the Hugging
// Face repo id when the path lies in a hub cache
// (`.../models--<org>--<name>/snapshots/<revision>/...`), else "" (null):
// a path on the training machine means nothing where the adapter is used.
std::string hub_repo_id(const std::string& path);

// A PEFT folder (or its adapter_model.safetensors), a diffusers folder (its
// pytorch_lora_weights.safetensors) or LoRA file, or an LTX-2 LoRA file.
// Module paths are returned as the model's own (prefixes removed).
LoraAdapter read_lora_file(const std::string& path);

}  // namespace ditrl::models
