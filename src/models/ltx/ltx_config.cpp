#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/ltx/ltx.hpp>

#include <boost/json.hpp>

namespace ditrl::models {

namespace json = boost::json;

namespace {

LtxConfig released(bool v23, bool audio) {
  // docs/families.md §3.2 (diffusers' convert_ltx2_to_diffusers.py version 2.0 /
  // 2.3 flags). Text length: the Gemma connector's 1024 tokens (FastVideo's
  // LTX2GemmaArchConfig.text_len; a prompt dataset fixes the real length).
  LtxConfig c;
  c.rope_type = "split";
  c.double_precision_rope = true;
  c.av_ca_timestep_scale_multiplier = 1000;
  c.apply_gated_attention = v23;
  c.cross_attention_adaln = v23;
  c.caption_projection = !v23;
  c.audio = audio;
  return c;
}

LtxConfig tiny(bool audio) {
  // docs/families.md §6.3 (every 2.3 feature), with an audio stream of the same
  // head count as ltx_core's AudioVideo build requires.
  LtxConfig c = released(true, audio);
  c.num_attention_heads = 4;
  c.attention_head_dim = 16;
  c.in_channels = 16;
  c.out_channels = 16;
  c.num_layers = 2;
  c.cross_attention_dim = 64;
  c.audio_num_attention_heads = 4;
  c.audio_attention_head_dim = 8;
  c.audio_in_channels = 8;
  c.audio_out_channels = 8;
  c.audio_cross_attention_dim = 32;
  c.text_tokens = 8;
  return c;
}

}  // namespace

std::vector<std::string> LtxConfig::preset_names() {
  return {"tiny", "tiny-video", "ltx-2.3", "ltx-2.3-video", "ltx-2", "ltx-2-video"};
}

LtxConfig LtxConfig::preset(const std::string& name) {
  if (name == "tiny") return tiny(true);
  if (name == "tiny-video") return tiny(false);
  if (name == "ltx-2.3") return released(true, true);
  if (name == "ltx-2.3-video") return released(true, false);
  if (name == "ltx-2") return released(false, true);
  if (name == "ltx-2-video") return released(false, false);
  fail("unknown ltx preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

LtxConfig LtxConfig::from_json(const std::string& text, const std::string& source, bool strict) {
  const json::object doc = json_config::parse_object(text, source);
  const json::object* fields = &doc;
  if (const json::value* t = fields->if_contains("transformer")) {
    if (!t->is_object()) fail("{}: 'transformer' must be an object", source);
    fields = &t->get_object();
  }
  LtxConfig c;
  json_config::read_config(*fields, source, "LTX transformer", c, strict, /*integral_doubles=*/true);
  return json_config::validated(std::move(c), source);
}

void LtxConfig::validate() const {
  json_config::require_positive("ltx", *this);
  if (rope_type != "split")
    fail("ltx config: rope_type \"{}\" is not supported (every LTX-2.x checkpoint uses \"split\")", rope_type);
  if (use_keyframes_abs_pos_embedding)
    fail("ltx config: use_keyframes_abs_pos_embedding (LTX-2.5.1+) is not supported");
  if (cross_attention_adaln && !use_prompt_adaln_single)
    fail("ltx config: cross_attention_adaln without use_prompt_adaln_single (LTX-2.5) is not supported");
  if (attention_head_dim % 2 != 0) fail("ltx config: attention_head_dim {} must be even (RoPE)", attention_head_dim);
  if (positional_embedding_max_pos.size() != 3)
    fail("ltx config: positional_embedding_max_pos must have 3 entries (frame, height, width), got {}",
         positional_embedding_max_pos.size());
  // ltx_core views the (projected) text features as (B, -1, D).
  if (cross_attention_dim != inner_dim())
    fail("ltx config: cross_attention_dim {} must equal num_attention_heads x attention_head_dim = {}",
         cross_attention_dim, inner_dim());
  if (!(norm_eps > 0) || !(timestep_scale_multiplier > 0) || !(positional_embedding_theta > 1))
    fail("ltx config: norm_eps, timestep_scale_multiplier and positional_embedding_theta must be positive (theta > 1)");
  if (!audio) return;
  if (audio_num_attention_heads != num_attention_heads)
    fail("ltx config: audio_num_attention_heads {} must equal num_attention_heads {} (ltx_core's AudioVideo model)",
         audio_num_attention_heads, num_attention_heads);
  if (audio_attention_head_dim % 2 != 0)
    fail("ltx config: audio_attention_head_dim {} must be even (RoPE)", audio_attention_head_dim);
  if (audio_cross_attention_dim != audio_inner_dim())
    fail(
        "ltx config: audio_cross_attention_dim {} must equal audio_num_attention_heads x audio_attention_head_dim = {}",
        audio_cross_attention_dim, audio_inner_dim());
  if (audio_positional_embedding_max_pos.size() != 1)
    fail("ltx config: audio_positional_embedding_max_pos must have 1 entry (time), got {}",
         audio_positional_embedding_max_pos.size());
  if (!(av_ca_timestep_scale_multiplier > 0)) fail("ltx config: av_ca_timestep_scale_multiplier must be positive");
}

std::string LtxConfig::to_json() const {
  if (!audio)
    fail(
        "ltx: a video-only model has no ltx_core checkpoint config (ltx_core's configurator always builds the "
        "audio stream); export the weights of an audio+video preset or give model.config");
  json::object t;
  json_config::write_config(*this, t);
  json::object o;
  o["transformer"] = std::move(t);
  return json::serialize(o);
}

}  // namespace ditrl::models
