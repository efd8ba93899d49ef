#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/packed_latents.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <numeric>
#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

constexpr double kNormEps = 1e-6;

bool is_note(const std::string& key) {
  return key.size() >= 5 && key.compare(key.size() - 5, 5, "_note") == 0;
}

// One (F, h, w) shared by the batch, from per-sample lists of image shapes
// [[(F, h, w)], ...] (one image per sample: the text-to-image model).
std::array<int64_t, 3> single_shape(const std::vector<std::vector<std::array<int64_t, 3>>>& shapes,
                                    const std::string& where) {
  if (shapes.empty()) fail("qwen_image: img_shapes {} is empty", where);
  for (const auto& sample : shapes) {
    if (sample.size() != 1)
      fail("qwen_image: img_shapes {} lists {} images for a sample; the text-to-image model takes one", where,
           sample.size());
    if (sample[0] != shapes[0][0])
      fail("qwen_image: img_shapes {} differ across the batch ({}x{}x{} vs {}x{}x{}); RoPE uses one grid per batch",
           where, sample[0][0], sample[0][1], sample[0][2], shapes[0][0][0], shapes[0][0][1], shapes[0][0][2]);
  }
  return shapes[0][0];
}

std::vector<std::vector<std::array<int64_t, 3>>> shapes_from_tensor(const at::Tensor& t) {
  if (t.dim() != 3 || t.size(2) != 3 || t.is_floating_point())
    fail("qwen_image: input 'img_shapes' must be an integer tensor [B, images, 3], got {} {}",
         c10::toString(t.scalar_type()), c10::str(t.sizes()));
  const at::Tensor v = t.to(at::kCPU, at::kLong).contiguous();
  std::vector<std::vector<std::array<int64_t, 3>>> out(static_cast<size_t>(v.size(0)));
  for (int64_t b = 0; b < v.size(0); ++b)
    for (int64_t i = 0; i < v.size(1); ++i)
      out[static_cast<size_t>(b)].push_back(
          {v[b][i][0].item<int64_t>(), v[b][i][1].item<int64_t>(), v[b][i][2].item<int64_t>()});
  return out;
}

std::vector<std::vector<std::array<int64_t, 3>>> shapes_from_json(const json::value& v) {
  const auto bad = [&] {
    fail("qwen_image: extra 'img_shapes' must be [[[F, h, w], ...], ...], got {}", json::serialize(v));
  };
  std::vector<std::vector<std::array<int64_t, 3>>> out;
  if (!v.is_array()) bad();
  for (const json::value& sample : v.get_array()) {
    if (!sample.is_array()) bad();
    out.emplace_back();
    for (const json::value& shape : sample.get_array()) {
      if (!shape.is_array() || shape.get_array().size() != 3) bad();
      std::array<int64_t, 3> s{};
      for (size_t k = 0; k < 3; ++k) s[k] = json_config::to_int(shape.get_array()[k], "img_shapes", "qwen_image extra");
      out.back().push_back(s);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> QwenImageConfig::preset_names() {
  return {"tiny", "qwen-image"};
}

QwenImageConfig QwenImageConfig::preset(const std::string& name) {
  if (name == "qwen-image") return QwenImageConfig{};  // docs/families.md §4.2
  if (name == "tiny") {
    // docs/families.md §6.4: every structural feature at hidden 64.
    QwenImageConfig c;
    c.num_layers = 2;
    c.num_attention_heads = 4;
    c.attention_head_dim = 16;
    c.joint_attention_dim = 32;
    c.axes_dims_rope = {4, 6, 6};
    c.text_tokens = 8;
    return c;
  }
  fail("unknown qwen_image preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

QwenImageConfig QwenImageConfig::from_json(const std::string& text, const std::string& source) {
  QwenImageConfig c;
  json_config::read_config(json_config::parse_object(text, source), source, "QwenImageTransformer2DModel", c);
  return json_config::validated(std::move(c), source);
}

void QwenImageConfig::validate() const {
  json_config::require_positive("qwen_image", *this);
  if (axes_dims_rope.size() != 3)
    fail("qwen_image config: axes_dims_rope must have 3 entries (frame, height, width), got {}", axes_dims_rope.size());
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  if (sum != attention_head_dim)
    fail("qwen_image config: axes_dims_rope [{}] must sum to attention_head_dim {}", fmt::join(axes_dims_rope, ", "),
         attention_head_dim);
}

QwenImageBlock::QwenImageBlock(const QwenImageConfig& config, AttentionBackend backend,
                               const at::TensorOptions& options) {
  const int64_t dim = config.inner_dim();
  auto img = register_module("img_mod", std::make_shared<Container>());
  img_mod = img->register_module("1", std::make_shared<Linear>(dim, 6 * dim, true, options));
  AttentionConfig ac;
  ac.dim = dim;
  ac.heads = config.num_attention_heads;
  ac.head_dim = config.attention_head_dim;
  ac.qk_norm = QKNorm::PerHead;
  ac.rms_flavour = RmsFlavour::Diffusers;
  ac.eps = kNormEps;
  ac.joint = true;
  ac.context_out = true;
  ac.order = JointOrder::TextFirst;
  ac.backend = backend;
  attn = register_module("attn", std::make_shared<Attention>(ac, options));
  img_mlp = register_module("img_mlp", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
  auto txt = register_module("txt_mod", std::make_shared<Container>());
  txt_mod = txt->register_module("1", std::make_shared<Linear>(dim, 6 * dim, true, options));
  txt_mlp = register_module("txt_mlp", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
}

// diffusers QwenImageTransformerBlock.forward, op for op.
Tensors QwenImageBlock::forward(const Tensors& inputs, Tap* tap, const std::string& module) {
  const auto record = [tap, &module](const char* sub, const at::Tensor& image, const at::Tensor& text) {
    if (!tap) return;
    const ForwardContext ctx{nullptr, tap};
    ctx.record(module + sub, "out0", image);
    ctx.record(module + sub, "out1", text);
  };
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& c = inputs.at(1);
  const at::Tensor& temb = inputs.at(2);
  const at::Tensor& img_freqs = inputs.at(3);
  const at::Tensor& txt_freqs = inputs.at(4);
  const at::Tensor& mask = inputs.at(5);
  // Halves for norm1 / norm2, each (shift, scale, gate).
  const std::vector<at::Tensor> img_halves = img_mod->forward(at::silu(temb)).chunk(2, -1);
  const std::vector<at::Tensor> txt_halves = txt_mod->forward(at::silu(temb)).chunk(2, -1);
  const std::vector<at::Tensor> i1 = img_halves[0].chunk(3, -1), i2 = img_halves[1].chunk(3, -1);
  const std::vector<at::Tensor> t1 = txt_halves[0].chunk(3, -1), t2 = txt_halves[1].chunk(3, -1);
  // RoPE on (B, L, H, Dh), the reference's layout of the (B, H, L, Dh) views.
  const auto rotary = [](const at::Tensor& freqs) -> QKRotary {
    return [freqs](at::Tensor& q, at::Tensor& k) {
      q = QwenRope::apply(q.transpose(1, 2), freqs).transpose(1, 2);
      k = QwenRope::apply(k.transpose(1, 2), freqs).transpose(1, 2);
    };
  };
  const at::Tensor img_modulated = modulate(layer_norm(x, kNormEps), i1[0], i1[1]);
  const at::Tensor txt_modulated = modulate(layer_norm(c, kNormEps), t1[0], t1[1]);
  record(".norm1", img_modulated, txt_modulated);
  const auto [img_attn, txt_attn] =
      attn->joint_attention(img_modulated, txt_modulated, mask, rotary(img_freqs), rotary(txt_freqs));
  record(".attn", img_attn, txt_attn);
  at::Tensor h = x + i1[2].unsqueeze(1) * img_attn;
  at::Tensor e = c + t1[2].unsqueeze(1) * txt_attn;
  h = h + i2[2].unsqueeze(1) * img_mlp->forward(modulate(layer_norm(h, kNormEps), i2[0], i2[1]));
  e = e + t2[2].unsqueeze(1) * txt_mlp->forward(modulate(layer_norm(e, kNormEps), t2[0], t2[1]));
  if (h.scalar_type() == at::kHalf) {
    e = e.clip(-65504, 65504);
    h = h.clip(-65504, 65504);
  }
  return {e, h};
}

QwenImage::QwenImage(const QwenImageConfig& config, const FamilyOptions& options)
    : config_(config), inputs_(options.inputs), rope_(config.axes_dims_rope) {
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  const int64_t dim = config_.inner_dim();
  auto time_text = register_module("time_text_embed", std::make_shared<Container>());
  timestep_embedder = time_text->register_module("timestep_embedder",
                                                 std::make_shared<MLPEmbedding>(256, dim, dim, Activation::SiLU, opts));
  txt_norm = register_module(
      "txt_norm", std::make_shared<RMSNorm>(config_.joint_attention_dim, kNormEps, RmsFlavour::Diffusers, opts));
  img_in = register_module("img_in", std::make_shared<Linear>(config_.in_channels, dim, true, opts));
  txt_in = register_module("txt_in", std::make_shared<Linear>(config_.joint_attention_dim, dim, true, opts));
  auto list = register_module("transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks.push_back(
        list->register_module(std::to_string(i), std::make_shared<QwenImageBlock>(config_, backend, opts)));
  norm_out = register_module("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, kNormEps, opts));
  const int64_t p = config_.patch_size;
  proj_out = register_module("proj_out", std::make_shared<Linear>(dim, p * p * config_.out_channels, true, opts));
}

void QwenImage::check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                             const at::Tensor& encoder_hidden_states_mask, const at::Tensor& timestep,
                             const std::array<int64_t, 3>& img_shape) const {
  require_input_shape("qwen_image", hidden_states, "hidden_states", {-1, -1, config_.in_channels});
  const int64_t batch = hidden_states.size(0);
  require_input_shape("qwen_image", encoder_hidden_states, "encoder_hidden_states",
                      {batch, -1, config_.joint_attention_dim});
  if (encoder_hidden_states_mask.defined()) {
    require_input_shape("qwen_image", encoder_hidden_states_mask, "encoder_hidden_states_mask",
                        {batch, encoder_hidden_states.size(1)});
    if (encoder_hidden_states_mask.is_floating_point())
      fail("qwen_image: encoder_hidden_states_mask must be integer or bool (1 = valid token), got {}",
           c10::toString(encoder_hidden_states_mask.scalar_type()));
  }
  require_input_shape("qwen_image", timestep, "timestep", {batch});
  for (int64_t n : img_shape)
    if (n <= 0) fail("qwen_image: img_shapes ({}, {}, {}) must be positive", img_shape[0], img_shape[1], img_shape[2]);
  if (img_shape[0] * img_shape[1] * img_shape[2] != hidden_states.size(1))
    fail("qwen_image: img_shapes ({}, {}, {}) make {} image tokens, hidden_states has {}", img_shape[0], img_shape[1],
         img_shape[2], img_shape[0] * img_shape[1] * img_shape[2], hidden_states.size(1));
  const c10::ScalarType weights = img_in->weight.scalar_type();
  if (hidden_states.scalar_type() != weights)
    fail("qwen_image: input 'hidden_states' is {} but the img_in weights are {} (pass inputs in the forward dtype)",
         precision::dtype_name(hidden_states.scalar_type()), precision::dtype_name(weights));
}

at::Tensor QwenImage::joint_mask(const at::Tensor& text_mask, const at::Tensor& text_mask_on_host, int64_t batch,
                                 int64_t text_len, int64_t image_len) const {
  if (!text_mask.defined() || text_mask_on_host.to(at::kBool).all().item<bool>()) return {};
  const at::Tensor valid = text_mask.to(at::kBool);
  const at::Tensor image = at::ones({batch, image_len}, valid.options());
  return at::cat({valid, image}, 1).view({batch, 1, 1, text_len + image_len});
}

at::Tensor QwenImage::forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                              const at::Tensor& encoder_hidden_states_mask, const at::Tensor& mask_on_host,
                              const at::Tensor& timestep, const std::array<int64_t, 3>& img_shape,
                              const ForwardContext& ctx) {
  check_inputs(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, timestep, img_shape);
  const int64_t batch = hidden_states.size(0), text_len = encoder_hidden_states.size(1);
  at::Tensor x = img_in->forward(hidden_states);
  ctx.record("img_in", "out0", x);
  // sigma in the hidden dtype, then the sinusoid scales by 1000 after t * f.
  const at::Tensor t = timestep.to(x.scalar_type());
  ctx.record("time_text_embed", "in0", t);
  at::Tensor c = txt_norm->forward(encoder_hidden_states);
  ctx.record("txt_norm", "out0", c);
  c = txt_in->forward(c);
  ctx.record("txt_in", "out0", c);
  SinusoidOptions sinusoid;
  sinusoid.scale = 1000;
  const at::Tensor temb = timestep_embedder->forward(timestep_sinusoid(t, sinusoid).to(x.scalar_type()));
  ctx.record("time_text_embed", "out0", temb);
  const auto [img_freqs, txt_freqs] = rope_.freqs(img_shape[0], img_shape[1], img_shape[2], text_len, x.device());
  const at::Tensor mask = joint_mask(encoder_hidden_states_mask, mask_on_host, batch, text_len, x.size(1));

  for (size_t i = 0; i < blocks.size(); ++i) {
    QwenImageBlock* block = blocks[i].get();
    // Names are built only when a tap listens; the unit function may be
    // called again in backward, so it holds copies, not references.
    const std::string module = ctx.tap ? "transformer_blocks." + std::to_string(i) : std::string();
    Tap* tap = ctx.tap;
    const Tensors out =
        ctx.run_unit(i, {x, c, temb, img_freqs, txt_freqs, mask},
                     [block, tap, module](const Tensors& in) { return block->forward(in, tap, module); });
    c = out.at(0);
    x = out.at(1);
    ctx.record(module, "out0", c);
    ctx.record(module, "out1", x);
  }
  x = norm_out->forward(x, temb);
  ctx.record("norm_out", "out0", x);
  x = proj_out->forward(x);
  ctx.record("proj_out", "out0", x);
  return x;
}

at::Tensor QwenImage::noise_pred(const at::Tensor& latents, const at::Tensor& /*timesteps*/, const at::Tensor& sigmas,
                                 const Cond& cond, const ForwardContext& ctx) {
  // Qwen-Image reads the sigma snapshot in [0, 1]; the trajectory timesteps
  // are never read (sigma * 1000 and t differ in the last ulp).
  const int64_t p = config_.patch_size;
  require_input_shape("qwen_image", latents, "latents", {-1, config_.in_channels / (p * p), -1, -1});
  if (latents.size(2) % p != 0 || latents.size(3) % p != 0)
    fail("qwen_image: latent height and width {}x{} must be multiples of patch_size {}", latents.size(2),
         latents.size(3), p);
  const char* mask_name = "encoder_hidden_states_mask";
  const bool masked = cond.has(mask_name);
  const at::Tensor out =
      forward(pack_latents(inputs_.cast_latents(latents), p), inputs_.cast_cond(cond.at("encoder_hidden_states")),
              masked ? cond.at(mask_name) : at::Tensor(), masked ? cond.on_host(mask_name) : at::Tensor(),
              inputs_.cast_timestep(sigmas), {1, latents.size(2) / p, latents.size(3) / p}, ctx);
  return unpack_latents(out, latents.size(2), latents.size(3), p);
}

std::map<std::string, at::Tensor> QwenImage::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                               const std::string& extra_json,
                                                               const ForwardContext& ctx) {
  const std::set<std::string> required = {"hidden_states", "encoder_hidden_states", "timestep"};
  const std::set<std::string> optional = {"encoder_hidden_states_mask", "img_shapes"};
  for (const auto& [name, tensor] : inputs)
    if (!required.count(name) && !optional.count(name))
      fail("qwen_image: unexpected input '{}' (the forward takes {}, optionally {})", name, fmt::join(required, ", "),
           fmt::join(optional, ", "));
  for (const std::string& name : required)
    if (!inputs.count(name))
      fail("qwen_image: missing input '{}' (the forward takes {})", name, fmt::join(required, ", "));
  json::error_code ec;
  const json::value extra = json::parse(extra_json.empty() ? "{}" : extra_json, ec);
  if (ec || !extra.is_object()) fail("qwen_image: extra arguments must be a JSON object, got '{}'", extra_json);
  std::optional<std::array<int64_t, 3>> from_json, from_tensor;
  for (const auto& [key, value] : extra.get_object()) {
    const std::string k(key);
    if (k == "img_shapes")
      from_json = single_shape(shapes_from_json(value), "(extra)");
    else if (!is_note(k))
      fail("qwen_image: unknown extra argument '{}' (expected img_shapes)", k);
  }
  if (inputs.count("img_shapes")) from_tensor = single_shape(shapes_from_tensor(inputs.at("img_shapes")), "(tensor)");
  if (!from_json && !from_tensor) fail("qwen_image: img_shapes is missing (an input tensor or an extra argument)");
  if (from_json && from_tensor && *from_json != *from_tensor)
    fail("qwen_image: the img_shapes tensor and the extra img_shapes disagree");
  const at::Tensor mask =
      inputs.count("encoder_hidden_states_mask") ? inputs.at("encoder_hidden_states_mask") : at::Tensor();
  // The inputs of `ditrl forward` and the fixtures: the mask is its own host
  // copy (read back from a GPU once per call, outside training and rollouts).
  return {{"output", forward(inputs.at("hidden_states"), inputs.at("encoder_hidden_states"), mask, mask,
                             inputs.at("timestep"), from_tensor ? *from_tensor : *from_json, ctx)}};
}

std::vector<WrapUnit> QwenImage::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t i = 0; i < blocks.size(); ++i) units.push_back({"transformer_blocks." + std::to_string(i), blocks[i]});
  return units;
}

std::vector<std::string> QwenImage::default_lora_targets() const {
  // miles configs/qwen_image.py (docs/families.md §4.8).
  return {"to_q",
          "to_k",
          "to_v",
          "to_out.0",
          "add_q_proj",
          "add_k_proj",
          "add_v_proj",
          "to_add_out",
          "img_mlp.net.0.proj",
          "img_mlp.net.2",
          "txt_mlp.net.0.proj",
          "txt_mlp.net.2"};
}

double QwenImage::guidance_scale(const GuidanceOptions& g, double /*timestep*/) const {
  // docs/algorithms.md §3.7: true_cfg_scale when set, else guidance_scale.
  return g.true_cfg_scale ? *g.true_cfg_scale : g.scale;
}

at::Tensor QwenImage::cfg_combine(const at::Tensor& pos, const at::Tensor& neg, const GuidanceOptions& g,
                                  double timestep) const {
  const at::Tensor comb = neg + guidance_scale(g, timestep) * (pos - neg);
  if (!g.true_cfg_scale || *g.true_cfg_scale <= 1.0) return comb;
  // True CFG rescales each token to the positive prediction's norm over its
  // packed channels (the pipeline's last axis): computed on the packed
  // layout, as the pipeline does.
  const int64_t p = config_.patch_size;
  const at::Tensor pos_packed = pack_latents(pos, p);
  const at::Tensor comb_packed = pack_latents(comb, p);
  const at::Tensor rescaled = comb_packed * (at::norm(pos_packed, 2, {-1}, /*keepdim=*/true) /
                                             at::norm(comb_packed, 2, {-1}, /*keepdim=*/true));
  return unpack_latents(rescaled, pos.size(2), pos.size(3), p);
}

std::vector<int64_t> QwenImage::latent_shape(int64_t batch, const LatentGrid& grid) const {
  const int64_t p = config_.patch_size;
  if (grid.frames != 1) fail("qwen_image: an image model; the latent grid must have frames = 1, got {}", grid.frames);
  if (grid.height % p != 0 || grid.width % p != 0)
    fail("qwen_image: latent grid {}x{} must be a multiple of patch_size {} (2x2 packing)", grid.height, grid.width, p);
  if (config_.in_channels != p * p * config_.out_channels)
    fail(
        "qwen_image: sampling needs in_channels ({}) = patch_size^2 x out_channels ({}) so that the velocity has the "
        "latent's shape",
        config_.in_channels, p * p * config_.out_channels);
  return {batch, config_.out_channels, grid.height, grid.width};
}

LatentRgbFactors QwenImage::latent_rgb_factors() const {
  if (config_.out_channels != 16) return {};
  // Qwen-Image's VAE is Wan2.1's: ComfyUI previews it with latent_formats.Wan21.
  LatentRgbFactors f = wan21_vae_factors();
  f.source += " (Qwen-Image's VAE)";
  return f;
}

std::vector<CondSpec> QwenImage::cond_spec() const {
  return {{"encoder_hidden_states", {config_.text_tokens, config_.joint_attention_dim}, c10::ScalarType::Float},
          {"encoder_hidden_states_mask", {config_.text_tokens}, c10::ScalarType::Long}};
}

std::string QwenImageConfig::to_json() const {
  json::object o = json_config::diffusers_header("QwenImageTransformer2DModel");
  json_config::write_config(*this, o);
  return json::serialize(o);
}

}  // namespace ditrl::models
