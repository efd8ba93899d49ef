#pragma once

// The model cases both peer benchmarks train (peer_forward.cpp: one rank
// against diffusers; fsdp_step.cpp: N ranks against FSDP2): each family's
// config.json objects, batch and token counts, the shared weights / inputs
// files, and the precision plan `ditrl train` would compile.

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/plan.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace peer {

namespace json = boost::json;
using namespace ditrl;

struct Case {
  std::string family;   // create_family name
  std::string name;     // row label
  json::object config;  // the config.json both sides build the model from
  int64_t batch;
  models::LatentGrid grid;
  int64_t image_tokens, text_tokens;
  int warmup, rounds, steps_per_round;
};

inline json::object sd3_config(int64_t sample_size, int64_t layers, int64_t heads, int64_t head_dim, int64_t joint_dim,
                               int64_t pooled_dim, int64_t pos_embed_max_size, json::array dual) {
  return {{"_class_name", "SD3Transformer2DModel"},
          {"sample_size", sample_size},
          {"patch_size", 2},
          {"in_channels", 16},
          {"num_layers", layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"caption_projection_dim", heads * head_dim},
          {"pooled_projection_dim", pooled_dim},
          {"out_channels", 16},
          {"pos_embed_max_size", pos_embed_max_size},
          {"dual_attention_layers", std::move(dual)},
          {"qk_norm", "rms_norm"}};
}

// The sd3 `tiny` preset, and ~110M parameters: SD3.5-medium's structure (qk
// RMSNorm, a dual-attention block, the real text widths) at width 768 and 5
// blocks.
inline std::vector<Case> sd3_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = sd3_config(16, 4, 4, 16, 48, 32, 12, {0, 1});
  return {
      {"sd3", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
      {"sd3", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
      {"sd3", "sd3-110m", sd3_config(64, 5, 12, 64, 4096, 2048, 64, {0}), 2, {1, 32, 32}, 256, 128, 3, big_rounds, 1}};
}

inline json::object wan_config(int64_t layers, int64_t heads, int64_t head_dim, int64_t ffn_dim, int64_t text_dim,
                               int64_t freq_dim) {
  return {{"_class_name", "WanTransformer3DModel"},
          {"patch_size", json::array{1, 2, 2}},
          {"num_attention_heads", heads},
          {"attention_head_dim", head_dim},
          {"in_channels", 16},
          {"out_channels", 16},
          {"text_dim", text_dim},
          {"freq_dim", freq_dim},
          {"ffn_dim", ffn_dim},
          {"num_layers", layers},
          {"cross_attn_norm", true},
          {"qk_norm", "rms_norm_across_heads"},
          {"eps", 1e-6},
          {"rope_max_seq_len", 1024}};
}

// The wan `tiny` preset, and ~103M parameters: Wan2.1's structure at width
// 768 (6 heads x 128, the released head dim) with 10 blocks, UMT5 text width
// 4096, a 4 x 16 x 16 latent video (256 tokens).
inline std::vector<Case> wan_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = wan_config(2, 2, 32, 128, 32, 256);
  return {{"wan", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"wan", "tiny", tiny, 2, {4, 8, 8}, 64, 8, 10, tiny_rounds, 10},
          {"wan", "wan-103m", wan_config(10, 6, 128, 3072, 4096, 256), 2, {4, 16, 16}, 256, 128, 3, big_rounds, 1}};
}

inline json::object qwen_image_config(int64_t layers, int64_t heads, int64_t head_dim, int64_t joint_dim,
                                      json::array axes) {
  return {{"_class_name", "QwenImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 64},
          {"out_channels", 16},
          {"num_layers", layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"guidance_embeds", false},
          {"axes_dims_rope", std::move(axes)}};
}

// The qwen_image `tiny` preset, and ~111M parameters: Qwen-Image's structure
// at width 768 (6 heads x 128, RoPE axes 16/56/56) with 5 blocks, text width
// 3584, a 32 x 32 latent (256 packed tokens).
inline std::vector<Case> qwen_image_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = qwen_image_config(2, 4, 16, 32, {4, 6, 6});
  return {{"qwen_image", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"qwen_image", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
          {"qwen_image",
           "qwen-111m",
           qwen_image_config(5, 6, 128, 3584, {16, 56, 56}),
           2,
           {1, 32, 32},
           256,
           128,
           3,
           big_rounds,
           1}};
}

inline json::object flux_config(int64_t layers, int64_t single_layers, int64_t heads, int64_t head_dim,
                                int64_t joint_dim, int64_t pooled_dim, json::array axes) {
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", 1},
          {"in_channels", 64},
          {"num_layers", layers},
          {"num_single_layers", single_layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"pooled_projection_dim", pooled_dim},
          {"guidance_embeds", false},
          {"axes_dims_rope", std::move(axes)}};
}

// The flux `tiny-schnell` preset, and ~75M parameters: FLUX.1's structure
// (double then single blocks, RoPE axes 16/56/56, the real text widths) at
// width 768 with 2 + 3 blocks, a 32 x 32 latent (256 packed tokens). Without
// the guidance embedder (FLUX.1-schnell's), so that both sides take the
// conditioning tensors alone.
inline std::vector<Case> flux_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = flux_config(2, 2, 4, 16, 32, 24, {4, 6, 6});
  return {{"flux", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"flux", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
          {"flux",
           "flux-75m",
           flux_config(2, 3, 6, 128, 4096, 768, {16, 56, 56}),
           2,
           {1, 32, 32},
           256,
           128,
           3,
           big_rounds,
           1}};
}

inline json::object flux2_config(int64_t layers, int64_t single_layers, int64_t heads, int64_t head_dim,
                                 int64_t joint_dim, json::array axes) {
  return {{"_class_name", "Flux2Transformer2DModel"},
          {"patch_size", 1},
          {"in_channels", 16},
          {"out_channels", 16},
          {"num_layers", layers},
          {"num_single_layers", single_layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"timestep_guidance_channels", 256},
          {"mlp_ratio", 3.0},
          {"axes_dims_rope", std::move(axes)},
          {"rope_theta", 2000},
          {"eps", 1e-6},
          {"guidance_embeds", false}};
}

// The flux2 `tiny` preset, and ~78M parameters: FLUX.2 [klein]'s structure
// (double then single-stream blocks, shared modulation, SwiGLU) at width 768
// (6 heads x 128, RoPE axes 32 x 4) with 2 double and 4 single blocks, text
// width 7680 (klein 4B's), a 32 x 32 VAE grid (256 packed tokens).
inline std::vector<Case> flux2_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = flux2_config(2, 2, 4, 16, 32, {4, 4, 4, 4});
  return {{"flux2", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"flux2", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
          {"flux2",
           "flux2-78m",
           flux2_config(2, 4, 6, 128, 7680, {32, 32, 32, 32}),
           2,
           {1, 32, 32},
           256,
           128,
           3,
           big_rounds,
           1}};
}

struct FamilyBench {
  std::vector<Case> (*cases)(int tiny_rounds, int big_rounds);
  // Conditioning tensors whose first per-prompt dimension is the text length.
  std::vector<std::string> text_conds;
};

inline const std::map<std::string, FamilyBench> kFamilies = {
    {"sd3", {sd3_cases, {"encoder_hidden_states"}}},
    {"wan", {wan_cases, {"encoder_hidden_states"}}},
    {"qwen_image", {qwen_image_cases, {"encoder_hidden_states", "encoder_hidden_states_mask"}}},
    {"flux", {flux_cases, {"encoder_hidden_states"}}},
    {"flux2", {flux2_cases, {"encoder_hidden_states"}}},
};

inline std::shared_ptr<models::Family> make_family(
    const std::string& family, const std::string& config, c10::ScalarType compute = at::kFloat,
    models::AttentionBackend attention = models::AttentionBackend::Math) {
  models::FamilyOptions options;
  options.family = family;
  options.config_json = config;
  options.attention = attention;
  options.init_seed = 1234;
  // The deck's defaults: latents and conditioning cast to the compute dtype, the timestep passed through.
  using precision::InputDtype;
  options.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, compute);
  return models::create_family(options);
}

// What `ditrl train` compiles for a deck with precision.forward = compute and
// the family's default fp32-kept parameters (app/options.cpp compiled_plan).
inline precision::CompiledPlan training_plan(models::Family& family, c10::ScalarType compute) {
  std::vector<precision::DtypeRule> rules;
  for (const models::DtypeOverride& rule : family.default_overrides())
    rules.push_back({rule.pattern, rule.dtype, "family default", /*must_match=*/false});
  std::vector<std::string> names;
  for (const auto& item : family.named_parameters()) names.push_back(item.key());
  return precision::PrecisionPlan(at::kFloat, at::kFloat, compute, std::move(rules)).compile(names);
}

// Weights from ditrl's seeded init and inputs drawn in a fixed order:
// latents, the float conditioning tensors in cond_spec order (masks: all
// ones), timesteps linspace(100, 900), sigmas = timesteps / 1000, target.
inline void prepare_case(const Case& c, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << json::serialize(c.config);
  const auto family = make_family(c.family, dir + "/config.json");
  io::write_safetensors(dir + "/weights.safetensors", models::state_tensors(*family));
  const std::vector<std::string>& text_conds = kFamilies.at(c.family).text_conds;
  at::manual_seed(99);
  const std::vector<int64_t> latent_shape = family->latent_shape(c.batch, c.grid);
  io::NamedTensors inputs = {{"latents", at::randn(latent_shape)}};
  for (const models::CondSpec& spec : family->cond_spec()) {
    std::vector<int64_t> shape = {c.batch};
    shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
    if (std::find(text_conds.begin(), text_conds.end(), spec.name) != text_conds.end()) shape[1] = c.text_tokens;
    inputs.emplace_back("cond." + spec.name, c10::isFloatingType(spec.dtype)
                                                 ? at::randn(shape).to(spec.dtype)
                                                 : at::ones(shape, at::TensorOptions().dtype(spec.dtype)));
  }
  const at::Tensor t = at::linspace(100, 900, c.batch);
  inputs.emplace_back("timesteps", t);
  inputs.emplace_back("sigmas", t / 1000);
  inputs.emplace_back("target", at::randn(latent_shape));
  io::write_safetensors(dir + "/inputs.safetensors", inputs);
}

}  // namespace peer
