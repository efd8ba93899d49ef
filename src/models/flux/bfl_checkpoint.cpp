#include <ditrl/error.hpp>
#include <ditrl/models/flux/bfl_checkpoint.hpp>

#include <optional>

namespace ditrl::models {

namespace {

constexpr const char* kComfyPrefix = "model.diffusion_model.";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// A module inside a block, named in one layout, and its block's prefix in
// the other: "double_blocks.3.img_attn.qkv" read from BFL's layout ->
// ("transformer_blocks.3.", double_block rules, "img_attn.qkv"); a module
// outside the blocks keeps its name, with the top-level rules.
struct InBlock {
  std::string other_prefix;
  const std::vector<BflRule>* rules = nullptr;
  std::string module;
};

struct BlockKind {
  const char* bfl;
  const char* diffusers;
  std::vector<BflRule> BflLayout::*rules;
};
const BlockKind kBlockKinds[] = {{"double_blocks.", "transformer_blocks.", &BflLayout::double_block},
                                 {"single_blocks.", "single_transformer_blocks.", &BflLayout::single_block}};

std::optional<InBlock> in_block(const std::string& module, const BflLayout& layout, bool from_bfl) {
  for (const BlockKind& kind : kBlockKinds) {
    const std::string from = from_bfl ? kind.bfl : kind.diffusers, to = from_bfl ? kind.diffusers : kind.bfl;
    if (!starts_with(module, from)) continue;
    const size_t index_end = module.find('.', from.size());
    if (index_end == std::string::npos) return std::nullopt;
    return InBlock{to + module.substr(from.size(), index_end - from.size()) + ".", &(layout.*kind.rules),
                   module.substr(index_end + 1)};
  }
  return InBlock{"", &layout.model, module};
}

// A stored tensor's name as its place (block prefix read, rules, module
// within the block) and parameter; nullopt for a name outside BFL's layout.
struct Place {
  InBlock block;
  std::string parameter;
};

std::optional<Place> place_of(const std::string& name, const BflLayout& layout) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  const std::optional<InBlock> block = in_block(name.substr(0, dot), layout, /*from_bfl=*/true);
  if (!block) return std::nullopt;
  const std::string parameter = name.substr(dot + 1);
  return Place{*block, parameter == "scale" ? "weight" : parameter};  // BFL's RMSNorm weights are `scale`
}

const BflRule* rule_for(const Place& p) {
  for (const BflRule& r : *p.block.rules)
    if (r.from == p.block.module) return &r;
  return nullptr;
}

// The rows of `stored` each of rule.to reads.
std::vector<io::StoredRows> split_rows(const io::Checkpoint& checkpoint, const std::string& stored,
                                       const std::string& weight, const BflRule& rule) {
  const int64_t rows = checkpoint.info(stored).shape.at(0);
  switch (rule.rows) {
    case BflRows::whole:
      return {{stored, 0, rows}};
    case BflRows::thirds: {
      if (rows % 3 != 0)
        fail("{}: '{}' has {} rows; fused q, k and v need a multiple of 3", checkpoint.path(), stored, rows);
      const int64_t n = rows / 3;
      return {{stored, 0, n}, {stored, n, 2 * n}, {stored, 2 * n, rows}};
    }
    case BflRows::qkv_mlp: {
      if (!checkpoint.contains(weight) || checkpoint.info(weight).shape.size() != 2)
        fail("{}: '{}' needs the 2-D '{}' beside it to tell its width", checkpoint.path(), stored, weight);
      const int64_t d = checkpoint.info(weight).shape[1];
      if (rows <= 3 * d)
        fail("{}: '{}' has {} rows; fused q, k, v of width {} and the MLP input need more than {}", checkpoint.path(),
             stored, rows, d, 3 * d);
      return {{stored, 0, d}, {stored, d, 2 * d}, {stored, 2 * d, 3 * d}, {stored, 3 * d, rows}};
    }
    case BflRows::swap_halves:
      if (rows % 2 != 0)
        fail("{}: '{}' has {} rows; (shift, scale) halves need an even count", checkpoint.path(), stored, rows);
      return {{stored, rows / 2, rows}, {stored, 0, rows / 2}};
  }
  return {};
}

}  // namespace

std::map<std::string, std::vector<io::StoredRows>> bfl_regrouping(const io::Checkpoint& checkpoint,
                                                                  const BflLayout& layout) {
  // BFL's layout is the one with double_blocks (diffusers': transformer_blocks).
  std::optional<std::string> found;
  for (const std::string& stored : checkpoint.names())
    for (const std::string& prefix : {std::string(kComfyPrefix), std::string()})
      if (!found && starts_with(stored, prefix + "double_blocks.")) found = prefix;
  if (!found) return {};
  const std::string prefix = *found;
  std::map<std::string, std::vector<io::StoredRows>> out;
  for (const std::string& stored : checkpoint.names()) {
    if (!starts_with(stored, prefix)) continue;
    const std::optional<Place> place = place_of(stored.substr(prefix.size()), layout);
    if (!place) continue;
    const BflRule* rule = rule_for(*place);
    if (!rule) continue;
    const std::string weight = stored.substr(0, stored.rfind('.')) + ".weight";
    std::vector<io::StoredRows> rows = split_rows(checkpoint, stored, weight, *rule);
    auto read = [&](size_t i) { return place->block.other_prefix + rule->to.at(i) + "." + place->parameter; };
    if (rule->rows == BflRows::swap_halves) {
      out[read(0)] = rows;  // one module, its halves exchanged
      continue;
    }
    for (size_t i = 0; i < rows.size(); ++i) out[read(i)] = {rows[i]};
  }
  return out;
}

BflLayout bfl_layout(const std::string& time_embed, const BflLayout& own) {
  BflLayout out{{{"img_in", {"x_embedder"}},
                 {"txt_in", {"context_embedder"}},
                 {"time_in.in_layer", {time_embed + ".timestep_embedder.linear_1"}},
                 {"time_in.out_layer", {time_embed + ".timestep_embedder.linear_2"}},
                 {"guidance_in.in_layer", {time_embed + ".guidance_embedder.linear_1"}},
                 {"guidance_in.out_layer", {time_embed + ".guidance_embedder.linear_2"}},
                 {"final_layer.linear", {"proj_out"}},
                 {"final_layer.adaLN_modulation.1", {"norm_out.linear"}, BflRows::swap_halves}},
                {{"img_attn.qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}, BflRows::thirds},
                 {"txt_attn.qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}, BflRows::thirds},
                 {"img_attn.norm.query_norm", {"attn.norm_q"}},
                 {"img_attn.norm.key_norm", {"attn.norm_k"}},
                 {"txt_attn.norm.query_norm", {"attn.norm_added_q"}},
                 {"txt_attn.norm.key_norm", {"attn.norm_added_k"}},
                 {"img_attn.proj", {"attn.to_out.0"}},
                 {"txt_attn.proj", {"attn.to_add_out"}}},
                {{"norm.query_norm", {"attn.norm_q"}}, {"norm.key_norm", {"attn.norm_k"}}}};
  out.model.insert(out.model.end(), own.model.begin(), own.model.end());
  out.double_block.insert(out.double_block.end(), own.double_block.begin(), own.double_block.end());
  out.single_block.insert(out.single_block.end(), own.single_block.begin(), own.single_block.end());
  return out;
}

std::optional<BflPlace> bfl_place(const std::string& diffusers_module, const BflLayout& layout) {
  const std::optional<InBlock> block = in_block(diffusers_module, layout, /*from_bfl=*/false);
  if (!block) return std::nullopt;
  for (const BflRule& r : *block->rules)
    for (size_t i = 0; i < r.to.size(); ++i)
      if (r.to[i] == block->module) return BflPlace{block->other_prefix + r.from, &r, i};
  return std::nullopt;
}

}  // namespace ditrl::models
