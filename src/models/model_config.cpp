#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/ltx.hpp>
#include <ditrl/models/model_config.hpp>
#include <ditrl/models/qwen_image.hpp>
#include <ditrl/models/sd3.hpp>
#include <ditrl/models/wan.hpp>

#include <boost/json.hpp>

namespace ditrl::models {

namespace json = boost::json;

namespace {

json::array int_list(const std::vector<int64_t>& v) {
  json::array out;
  for (int64_t x : v) out.emplace_back(x);
  return out;
}

json::object diffusers_header(const char* class_name) {
  json::object o;
  o["_class_name"] = class_name;
  o["_ditrl_version"] = build::kVersion;
  return o;
}

json::object sd3_config(const SD3Config& c) {
  json::object o = diffusers_header("SD3Transformer2DModel");
  o["sample_size"] = c.sample_size;
  o["patch_size"] = c.patch_size;
  o["in_channels"] = c.in_channels;
  o["num_layers"] = c.num_layers;
  o["attention_head_dim"] = c.attention_head_dim;
  o["num_attention_heads"] = c.num_attention_heads;
  o["joint_attention_dim"] = c.joint_attention_dim;
  o["caption_projection_dim"] = c.caption_projection_dim;
  o["pooled_projection_dim"] = c.pooled_projection_dim;
  o["out_channels"] = c.out_channels;
  o["pos_embed_max_size"] = c.pos_embed_max_size;
  o["dual_attention_layers"] = int_list(c.dual_attention_layers);
  if (c.qk_norm)
    o["qk_norm"] = "rms_norm";
  else
    o["qk_norm"] = nullptr;
  return o;
}

json::object wan_config(const WanConfig& c) {
  json::object o = diffusers_header("WanTransformer3DModel");
  o["patch_size"] = int_list(c.patch_size);
  o["num_attention_heads"] = c.num_attention_heads;
  o["attention_head_dim"] = c.attention_head_dim;
  o["in_channels"] = c.in_channels;
  o["out_channels"] = c.out_channels;
  o["text_dim"] = c.text_dim;
  o["freq_dim"] = c.freq_dim;
  o["ffn_dim"] = c.ffn_dim;
  o["num_layers"] = c.num_layers;
  o["cross_attn_norm"] = c.cross_attn_norm;
  o["qk_norm"] = "rms_norm_across_heads";
  o["eps"] = c.eps;
  o["image_dim"] = nullptr;
  o["added_kv_proj_dim"] = nullptr;
  o["rope_max_seq_len"] = c.rope_max_seq_len;
  o["pos_embed_seq_len"] = nullptr;
  return o;
}

json::object qwen_image_config(const QwenImageConfig& c) {
  json::object o = diffusers_header("QwenImageTransformer2DModel");
  o["patch_size"] = c.patch_size;
  o["in_channels"] = c.in_channels;
  o["out_channels"] = c.out_channels;
  o["num_layers"] = c.num_layers;
  o["attention_head_dim"] = c.attention_head_dim;
  o["num_attention_heads"] = c.num_attention_heads;
  o["joint_attention_dim"] = c.joint_attention_dim;
  o["guidance_embeds"] = false;
  o["axes_dims_rope"] = int_list(c.axes_dims_rope);
  return o;
}

// The keys LtxConfig::from_json reads, with the values ltx_core fixes.
json::object ltx_config(const LtxConfig& c) {
  if (!c.audio)
    fail(
        "ltx: a video-only model has no ltx_core checkpoint config (ltx_core's configurator always builds the "
        "audio stream); export the weights of an audio+video preset or give model.config");
  json::object t;
  t["num_attention_heads"] = c.num_attention_heads;
  t["attention_head_dim"] = c.attention_head_dim;
  t["in_channels"] = c.in_channels;
  t["out_channels"] = c.out_channels;
  t["num_layers"] = c.num_layers;
  t["cross_attention_dim"] = c.cross_attention_dim;
  t["norm_eps"] = c.norm_eps;
  t["positional_embedding_theta"] = c.positional_embedding_theta;
  t["positional_embedding_max_pos"] = int_list(c.positional_embedding_max_pos);
  t["timestep_scale_multiplier"] = c.timestep_scale_multiplier;
  t["use_middle_indices_grid"] = c.use_middle_indices_grid;
  t["rope_type"] = c.rope_type;
  t["frequencies_precision"] = c.double_precision_rope ? "float64" : "float32";
  t["apply_gated_attention"] = c.apply_gated_attention;
  t["cross_attention_adaln"] = c.cross_attention_adaln;
  t["use_prompt_adaln_single"] = c.use_prompt_adaln_single;
  t["caption_proj_before_connector"] = !c.caption_projection;
  t["caption_channels"] = c.caption_channels;
  t["ff_bias"] = c.ff_bias;
  t["audio_ff_bias"] = c.audio_ff_bias;
  t["use_keyframes_abs_pos_embedding"] = c.use_keyframes_abs_pos_embedding;
  t["audio_num_attention_heads"] = c.audio_num_attention_heads;
  t["audio_attention_head_dim"] = c.audio_attention_head_dim;
  t["audio_in_channels"] = c.audio_in_channels;
  t["audio_out_channels"] = c.audio_out_channels;
  t["audio_cross_attention_dim"] = c.audio_cross_attention_dim;
  t["audio_positional_embedding_max_pos"] = int_list(c.audio_positional_embedding_max_pos);
  t["av_ca_timestep_scale_multiplier"] = c.av_ca_timestep_scale_multiplier;
  json::object o;
  o["transformer"] = std::move(t);
  return o;
}

}  // namespace

std::string model_config_json(const Family& family) {
  if (const auto* f = dynamic_cast<const SD3*>(&family)) return json::serialize(sd3_config(f->config()));
  if (const auto* f = dynamic_cast<const Wan*>(&family)) return json::serialize(wan_config(f->config()));
  if (const auto* f = dynamic_cast<const QwenImage*>(&family)) return json::serialize(qwen_image_config(f->config()));
  if (const auto* f = dynamic_cast<const LTX*>(&family)) return json::serialize(ltx_config(f->config()));
  fail("no config writer for model family '{}'", family.family_name());
}

}  // namespace ditrl::models
