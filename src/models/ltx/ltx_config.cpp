#include <ditrl/error.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/ltx/ltx.hpp>

#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <functional>
#include <map>

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

std::string text(const json::value& v) {
  return json::serialize(v);
}

int64_t as_int(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64() && v.get_uint64() <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(v.get_uint64());
  if (v.is_double() && v.get_double() == static_cast<double>(static_cast<int64_t>(v.get_double())))
    return static_cast<int64_t>(v.get_double());
  fail("{}: '{}' must be an integer, got {}", source, key, text(v));
}

double as_double(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_double()) return v.get_double();
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  fail("{}: '{}' must be a number, got {}", source, key, text(v));
}

bool as_bool(const json::value& v, const std::string& key, const std::string& source) {
  if (!v.is_bool()) fail("{}: '{}' must be true or false, got {}", source, key, text(v));
  return v.get_bool();
}

std::string as_string(const json::value& v, const std::string& key, const std::string& source) {
  if (!v.is_string()) fail("{}: '{}' must be a string, got {}", source, key, text(v));
  return std::string(v.get_string());
}

std::vector<int64_t> as_ints(const json::value& v, const std::string& key, const std::string& source) {
  if (!v.is_array()) fail("{}: '{}' must be a list of integers, got {}", source, key, text(v));
  std::vector<int64_t> out;
  for (const json::value& e : v.get_array()) out.push_back(as_int(e, key, source));
  return out;
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

LtxConfig LtxConfig::from_json(const std::string& text_in, const std::string& source, bool strict) {
  json::error_code ec;
  const json::value doc = json::parse(text_in, ec);
  if (ec) fail("{}: not valid JSON: {}", source, ec.message());
  if (!doc.is_object()) fail("{}: an LTX config must be a JSON object", source);
  const json::object* fields = &doc.get_object();
  if (const json::value* t = fields->if_contains("transformer")) {
    if (!t->is_object()) fail("{}: 'transformer' must be an object", source);
    fields = &t->get_object();
  }
  LtxConfig c;
  using Setter = std::function<void(const json::value&, const std::string&)>;
  const auto integer = [&](int64_t* f) -> Setter {
    return [f, &source](const json::value& v, const std::string& k) { *f = as_int(v, k, source); };
  };
  const auto number = [&](double* f) -> Setter {
    return [f, &source](const json::value& v, const std::string& k) { *f = as_double(v, k, source); };
  };
  const auto flag = [&](bool* f) -> Setter {
    return [f, &source](const json::value& v, const std::string& k) { *f = as_bool(v, k, source); };
  };
  const auto ints = [&](std::vector<int64_t>* f) -> Setter {
    return [f, &source](const json::value& v, const std::string& k) { *f = as_ints(v, k, source); };
  };
  // Keys ltx_core's configurator insists on (check_config_value): any other
  // value builds a different model.
  const auto fixed = [&](json::value expected) -> Setter {
    return [expected, &source](const json::value& v, const std::string& k) {
      const bool same = (expected.is_double() && (v.is_double() || v.is_int64()))
                            ? as_double(v, k, source) == expected.get_double()
                            : v == expected;
      if (!same)
        fail("{}: '{}' = {} is not supported: ltx_core builds LTX-2 with {}", source, k, text(v), text(expected));
    };
  };
  const auto ignored = [](const json::value&, const std::string&) {};
  const std::map<std::string, Setter> keys = {
      {"num_attention_heads", integer(&c.num_attention_heads)},
      {"attention_head_dim", integer(&c.attention_head_dim)},
      {"in_channels", integer(&c.in_channels)},
      {"out_channels", integer(&c.out_channels)},
      {"num_layers", integer(&c.num_layers)},
      {"cross_attention_dim", integer(&c.cross_attention_dim)},
      {"norm_eps", number(&c.norm_eps)},
      {"positional_embedding_theta", number(&c.positional_embedding_theta)},
      {"positional_embedding_max_pos", ints(&c.positional_embedding_max_pos)},
      {"timestep_scale_multiplier", number(&c.timestep_scale_multiplier)},
      {"use_middle_indices_grid", flag(&c.use_middle_indices_grid)},
      {"rope_type", [&](const json::value& v, const std::string& k) { c.rope_type = as_string(v, k, source); }},
      {"frequencies_precision",
       [&](const json::value& v, const std::string& k) {
         const std::string p = v.is_bool() && !v.get_bool() ? "float32" : as_string(v, k, source);
         if (p != "float64" && p != "float32")
           fail("{}: 'frequencies_precision' must be \"float64\" or \"float32\", got {}", source, text(v));
         c.double_precision_rope = p == "float64";
       }},
      {"apply_gated_attention", flag(&c.apply_gated_attention)},
      {"cross_attention_adaln", flag(&c.cross_attention_adaln)},
      {"use_prompt_adaln_single", flag(&c.use_prompt_adaln_single)},
      {"caption_proj_before_connector",
       [&](const json::value& v, const std::string& k) { c.caption_projection = !as_bool(v, k, source); }},
      {"caption_channels", integer(&c.caption_channels)},
      {"ff_bias", flag(&c.ff_bias)},
      {"audio_ff_bias", flag(&c.audio_ff_bias)},
      {"use_keyframes_abs_pos_embedding", flag(&c.use_keyframes_abs_pos_embedding)},
      {"audio_num_attention_heads", integer(&c.audio_num_attention_heads)},
      {"audio_attention_head_dim", integer(&c.audio_attention_head_dim)},
      {"audio_in_channels", integer(&c.audio_in_channels)},
      {"audio_out_channels", integer(&c.audio_out_channels)},
      {"audio_cross_attention_dim", integer(&c.audio_cross_attention_dim)},
      {"audio_positional_embedding_max_pos", ints(&c.audio_positional_embedding_max_pos)},
      {"av_ca_timestep_scale_multiplier", number(&c.av_ca_timestep_scale_multiplier)},
      {"dropout", fixed(json::value(0.0))},
      {"attention_bias", fixed(json::value(true))},
      {"activation_fn", fixed(json::value("gelu-approximate"))},
      {"qk_norm", fixed(json::value("rms_norm"))},
      {"standardization_norm", fixed(json::value("rms_norm"))},
      {"norm_elementwise_affine", fixed(json::value(false))},
      {"positional_embedding_type", fixed(json::value("rope"))},
      {"use_audio_video_cross_attention", fixed(json::value(true))},
      // Legacy LTX-Video keys the LTX-2 model does not read.
      {"av_cross_ada_norm", ignored},
      {"cross_attention_norm", ignored},
      {"double_self_attention", ignored},
      {"num_embeds_ada_norm", ignored},
      {"num_vector_embeds", ignored},
      {"only_cross_attention", ignored},
      {"share_ff", ignored},
      {"upcast_attention", ignored},
      {"use_linear_projection", ignored},
  };
  std::vector<std::string> unknown;
  for (const auto& [k, v] : *fields) {
    const std::string key(k);
    if (key.rfind('_', 0) == 0) continue;  // _class_name, ...
    const auto it = keys.find(key);
    if (it == keys.end())
      unknown.push_back(key);
    else
      it->second(v, key);
  }
  if (!unknown.empty()) {
    if (strict) fail("{}: unknown LTX transformer config key(s) {}", source, fmt::join(unknown, ", "));
    spdlog::warn("{}: LTX transformer config keys not read by ditrl: {}", source, fmt::join(unknown, ", "));
  }
  return json_config::validated(std::move(c), source);
}

void LtxConfig::validate() const {
  json_config::require_positive("ltx", {{"num_attention_heads", num_attention_heads},
                                        {"attention_head_dim", attention_head_dim},
                                        {"in_channels", in_channels},
                                        {"out_channels", out_channels},
                                        {"num_layers", num_layers},
                                        {"cross_attention_dim", cross_attention_dim},
                                        {"caption_channels", caption_channels},
                                        {"text_tokens", text_tokens}});
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
  json_config::require_positive("ltx", {{"audio_num_attention_heads", audio_num_attention_heads},
                                        {"audio_attention_head_dim", audio_attention_head_dim},
                                        {"audio_in_channels", audio_in_channels},
                                        {"audio_out_channels", audio_out_channels}});
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

// The keys from_json reads, with the values ltx_core fixes.
std::string LtxConfig::to_json() const {
  const LtxConfig& c = *this;
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
  t["positional_embedding_max_pos"] = json_config::int_array(c.positional_embedding_max_pos);
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
  t["audio_positional_embedding_max_pos"] = json_config::int_array(c.audio_positional_embedding_max_pos);
  t["av_ca_timestep_scale_multiplier"] = c.av_ca_timestep_scale_multiplier;
  json::object o;
  o["transformer"] = std::move(t);
  return json::serialize(o);
}

}  // namespace ditrl::models
