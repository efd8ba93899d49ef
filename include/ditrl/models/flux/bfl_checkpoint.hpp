#pragma once

// Black Forest Labs' own checkpoint layout, read under diffusers' names
// (docs/families.md §5.2): the single files BFL releases (flux1-dev,
// flux1-schnell, flux2-dev, the FLUX.2 [klein] files) and ComfyUI's copies of
// them (the same names under `model.diffusion_model.`). Where diffusers keeps
// q, k and v apart, BFL fuses them into one `qkv` tensor per stream (and
// FLUX.1's single blocks fuse the MLP input too, in `linear1`); the final
// modulation stores (shift, scale) where diffusers keeps (scale, shift); the
// RMSNorm weights are called `scale`. Read with Checkpoint::regroup: no copy.

#include <ditrl/io/safetensors.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::models {

// How a BFL module's rows become diffusers modules.
enum class BflRows {
  whole,        // one module, renamed
  thirds,       // q, k, v: three equal row blocks
  qkv_mlp,      // q, k, v of the width (the weight's input size), then the MLP input: FLUX.1's linear1
  swap_halves,  // (shift, scale) stored, (scale, shift) read
};

struct BflRule {
  std::string from;             // BFL's module name
  std::vector<std::string> to;  // diffusers' module name(s), one per row block
  BflRows rows = BflRows::whole;
};

struct BflLayout {
  std::vector<BflRule> model;         // top-level modules
  std::vector<BflRule> double_block;  // in double_blocks.N, read as transformer_blocks.N
  std::vector<BflRule> single_block;  // in single_blocks.N, read as single_transformer_blocks.N
};

// BFL's rules where diffusers names FLUX.1's and FLUX.2's modules alike (the
// input projections, the time and guidance embedders under `time_embed`,
// the final layer, the double blocks' attention, the single blocks' q/k
// norms), then a family's `own`.
BflLayout bfl_layout(const std::string& time_embed, const BflLayout& own);

// The two families' layouts (diffusers' single-file converters as tables).
const BflLayout& flux1_bfl_layout();
const BflLayout& flux2_bfl_layout();

// Where a diffusers module (`transformer_blocks.0.attn.to_k`) is stored in
// BFL's layout: the BFL module (`double_blocks.0.img_attn.qkv`), its rule,
// and which of the rule's row blocks it is; nullopt for a module BFL's
// layout does not name.
struct BflPlace {
  std::string module;
  const BflRule* rule = nullptr;
  size_t part = 0;
};
std::optional<BflPlace> bfl_place(const std::string& diffusers_module, const BflLayout& layout);

// The Checkpoint::regroup table of `checkpoint` when it is in BFL's layout
// (it holds double_blocks.*, with or without ComfyUI's prefix); empty
// otherwise. A tensor no rule names is left as stored, so
// validate_checkpoint reports it under its own name; fused rows that do not
// split as the rule says are an Error naming the tensor.
std::map<std::string, std::vector<io::StoredRows>> bfl_regrouping(const io::Checkpoint& checkpoint,
                                                                  const BflLayout& layout);

}  // namespace ditrl::models
