#pragma once

// Parameter naming shared by the precision plan, LoRA and checkpoints.
// Canonical names are the checkpoint names (`transformer_blocks.3.attn.to_q.weight`);
// LoRA adds `X.lora_A.weight` / `X.lora_B.weight` next to base `X.weight`.
// PEFT spells the same parameters `base_model.model.X.base_layer.weight` and
// `base_model.model.X.lora_A.default.weight`; every lookup goes through
// canonical_name() first so a LoRA-wrapped model resolves like the raw one.

#include <string>

namespace ditrl::precision {

// Shell-style glob over dotted names: `*` matches any run of characters
// (dots included), `?` one character, `[abc]` / `[a-z]` / `[!a]` a class.
bool glob_match(const std::string& pattern, const std::string& name);

// PEFT / wrapped form -> canonical checkpoint name (identity for canonical names).
std::string canonical_name(const std::string& name);

// Canonical LoRA name -> PEFT form (`base_model.model.` prefix, `.default`
// adapter); a base weight becomes `X.base_layer.weight` when `wrapped`.
std::string peft_name(const std::string& canonical, bool wrapped = false);

// The base parameter a LoRA parameter adapts (`X.lora_A.weight` -> `X.weight`);
// identity for other names.
std::string lora_base_name(const std::string& canonical);
bool is_lora_name(const std::string& canonical);

}  // namespace ditrl::precision
