#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/sd3/sd3.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <algorithm>
#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

constexpr double kNormEps = 1e-6;

SD3Config real_config(int64_t layers, int64_t heads, int64_t pos_embed_max_size, int64_t dual_layers, bool qk_norm) {
  SD3Config c;
  c.num_layers = layers;
  c.num_attention_heads = heads;
  c.attention_head_dim = 64;
  c.caption_projection_dim = heads * 64;
  c.pos_embed_max_size = pos_embed_max_size;
  for (int64_t i = 0; i < dual_layers; ++i) c.dual_attention_layers.push_back(i);
  c.qk_norm = qk_norm;
  return c;
}

}  // namespace

bool SD3Config::dual(int64_t layer) const {
  return std::find(dual_attention_layers.begin(), dual_attention_layers.end(), layer) != dual_attention_layers.end();
}

std::vector<std::string> SD3Config::preset_names() {
  return {"tiny", "sd3-medium", "sd3.5-medium", "sd3.5-large"};
}

SD3Config SD3Config::preset(const std::string& name) {
  // docs/families.md §1.2 (released checkpoints) and §6.1 (tiny, every structural feature).
  if (name == "sd3-medium") return real_config(24, 24, 192, 0, false);
  if (name == "sd3.5-medium") return real_config(24, 24, 384, 13, true);
  if (name == "sd3.5-large") return real_config(38, 38, 192, 0, true);
  if (name == "tiny") {
    SD3Config c;
    c.sample_size = 16;
    c.num_layers = 4;
    c.num_attention_heads = 4;
    c.attention_head_dim = 16;
    c.joint_attention_dim = 48;
    c.caption_projection_dim = 64;
    c.pooled_projection_dim = 32;
    c.pos_embed_max_size = 12;
    c.dual_attention_layers = {0, 1};
    c.qk_norm = true;
    c.text_tokens = 8;
    return c;
  }
  fail("unknown sd3 preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

SD3Config SD3Config::from_json(const std::string& text, const std::string& source) {
  SD3Config c;
  json_config::read_config(json_config::parse_object(text, source), source, "SD3Transformer2DModel", c);
  return json_config::validated(std::move(c), source);
}

void SD3Config::validate() const {
  json_config::require_positive("sd3", *this);
  if (caption_projection_dim != inner_dim())
    fail("sd3 config: caption_projection_dim {} must equal num_attention_heads x attention_head_dim = {}",
         caption_projection_dim, inner_dim());
  if (sample_size / patch_size <= 0)
    fail("sd3 config: sample_size {} is smaller than patch_size {}", sample_size, patch_size);
  for (int64_t i : dual_attention_layers)
    if (i < 0 || i >= num_layers) fail("sd3 config: dual attention layer {} is not a block index < {}", i, num_layers);
}

JointTransformerBlock::JointTransformerBlock(const SD3Config& config, int64_t index, AttentionBackend backend,
                                             const at::TensorOptions& options)
    : context_pre_only_(index == config.num_layers - 1) {
  const int64_t dim = config.inner_dim();
  const bool dual = config.dual(index);
  norm1 = register_module("norm1", std::make_shared<AdaLayerNormZero>(dim, dual ? 9 : 6, options));
  if (context_pre_only_)
    norm1_context_last =
        register_module("norm1_context", std::make_shared<AdaLayerNormContinuous>(dim, dim, kNormEps, options));
  else
    norm1_context = register_module("norm1_context", std::make_shared<AdaLayerNormZero>(dim, 6, options));
  AttentionConfig ac;
  ac.dim = dim;
  ac.heads = config.num_attention_heads;
  ac.head_dim = config.attention_head_dim;
  ac.qk_norm = config.qk_norm ? QKNorm::PerHead : QKNorm::None;
  ac.rms_flavour = RmsFlavour::Diffusers;
  ac.eps = kNormEps;
  ac.joint = true;
  ac.context_out = !context_pre_only_;
  ac.order = JointOrder::ImageFirst;
  ac.backend = backend;
  attn = register_module("attn", std::make_shared<Attention>(ac, options));
  if (dual) {
    ac.joint = false;
    attn2 = register_module("attn2", std::make_shared<Attention>(ac, options));
  }
  ff = register_module("ff", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
  if (!context_pre_only_)
    ff_context = register_module("ff_context", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
}

// diffusers JointTransformerBlock.forward, op for op.
Tensors JointTransformerBlock::forward(const Tensors& inputs, const ForwardContext& ctx, const std::string& path) {
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& c = inputs.at(1);
  const at::Tensor& temb = inputs.at(2);
  // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2]
  const std::vector<at::Tensor> m = norm1->forward(temb);
  const at::Tensor x_norm = layer_norm(x, kNormEps);
  const at::Tensor x_in = modulate(x_norm, m[0], m[1]);
  std::vector<at::Tensor> cm;
  at::Tensor c_in;
  if (context_pre_only_) {
    c_in = norm1_context_last->forward(c, temb);
  } else {
    cm = norm1_context->forward(temb);
    c_in = modulate(layer_norm(c, kNormEps), cm[0], cm[1]);
  }
  const auto [attn_x, attn_c] = attn->joint_attention(x_in, c_in);
  if (ctx.tap) {  // diffusers forward-hook names: norm1 -> norm_hidden_states, attn -> (image, text)
    ctx.record(path + ".norm1", "out0", x_in);
    ctx.record(path + ".norm1_context", "out0", c_in);
    ctx.record(path + ".attn", "out0", attn_x);
    if (attn_c.defined()) ctx.record(path + ".attn", "out1", attn_c);  // none in the context_pre_only block
  }
  at::Tensor h = x + m[2].unsqueeze(1) * attn_x;
  if (attn2) {
    const at::Tensor attn2_x = attn2->self_attention(modulate(x_norm, m[6], m[7]));
    if (ctx.tap) ctx.record(path + ".attn2", "out0", attn2_x);
    h = h + m[8].unsqueeze(1) * attn2_x;
  }
  h = h + m[5].unsqueeze(1) * ff->forward(modulate(layer_norm(h, kNormEps), m[3], m[4]));
  if (context_pre_only_) return {h};
  at::Tensor e = c + cm[2].unsqueeze(1) * attn_c;
  e = e + cm[5].unsqueeze(1) * ff_context->forward(modulate(layer_norm(e, kNormEps), cm[3], cm[4]));
  return {e, h};
}

SD3::SD3(const SD3Config& config, const FamilyOptions& options) : config_(config), inputs_(options.inputs) {
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  const int64_t dim = config_.inner_dim();
  std::optional<std::pair<int64_t, int64_t>> window;
  if (options.sliced && options.crop_to_grid)
    window = {options.latent_grid.height / config_.patch_size, options.latent_grid.width / config_.patch_size};
  pos_embed = register_module("pos_embed", std::make_shared<PatchEmbed>(
                                               config_.in_channels, dim, config_.patch_size, config_.pos_embed_max_size,
                                               static_cast<double>(config_.sample_size / config_.patch_size), opts,
                                               options.buffer_options(), window));
  auto time_text = register_module("time_text_embed", std::make_shared<Container>());
  timestep_embedder = time_text->register_module("timestep_embedder",
                                                 std::make_shared<MLPEmbedding>(256, dim, dim, Activation::SiLU, opts));
  text_embedder = time_text->register_module(
      "text_embedder", std::make_shared<MLPEmbedding>(config_.pooled_projection_dim, dim, dim, Activation::SiLU, opts));
  context_embedder =
      register_module("context_embedder", std::make_shared<Linear>(config_.joint_attention_dim, dim, true, opts));
  auto list = register_module("transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks.push_back(
        list->register_module(std::to_string(i), std::make_shared<JointTransformerBlock>(config_, i, backend, opts)));
  norm_out = register_module("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, kNormEps, opts));
  proj_out = register_module(
      "proj_out",
      std::make_shared<Linear>(dim, config_.patch_size * config_.patch_size * config_.out_channels, true, opts));
}

void SD3::check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                       const at::Tensor& pooled_projections, const at::Tensor& timestep) const {
  require_input_shape("sd3", hidden_states, "hidden_states", {-1, config_.in_channels, -1, -1});
  const int64_t batch = hidden_states.size(0);
  require_input_shape("sd3", encoder_hidden_states, "encoder_hidden_states", {batch, -1, config_.joint_attention_dim});
  require_input_shape("sd3", pooled_projections, "pooled_projections", {batch, config_.pooled_projection_dim});
  require_input_shape("sd3", timestep, "timestep", {batch});
  const int64_t p = config_.patch_size;
  if (hidden_states.size(2) % p != 0 || hidden_states.size(3) % p != 0)
    fail("sd3: latent height and width {}x{} must be multiples of patch_size {}", hidden_states.size(2),
         hidden_states.size(3), p);
  const c10::ScalarType weights = pos_embed->proj->weight.scalar_type();
  if (hidden_states.scalar_type() != weights)
    fail("sd3: input 'hidden_states' is {} but the patch embedding weights are {} (pass inputs in the forward dtype)",
         precision::dtype_name(hidden_states.scalar_type()), precision::dtype_name(weights));
}

at::Tensor SD3::forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                        const at::Tensor& pooled_projections, const at::Tensor& timestep, const ForwardContext& ctx) {
  check_inputs(hidden_states, encoder_hidden_states, pooled_projections, timestep);
  const int64_t p = config_.patch_size;
  const int64_t h = hidden_states.size(2) / p;
  const int64_t w = hidden_states.size(3) / p;

  at::Tensor x = pos_embed->forward(hidden_states);
  ctx.record("pos_embed", "out0", x);
  ctx.record("time_text_embed", "in0", timestep);  // the AdaLN conditioning's time input
  const at::Tensor t_emb = timestep_sinusoid(timestep, SinusoidOptions{});
  const at::Tensor temb = timestep_embedder->forward(t_emb.to(pooled_projections.scalar_type())) +
                          text_embedder->forward(pooled_projections);
  ctx.record("time_text_embed", "out0", temb);
  at::Tensor c = context_embedder->forward(encoder_hidden_states);
  ctx.record("context_embedder", "out0", c);

  for (size_t i = 0; i < blocks.size(); ++i) {
    JointTransformerBlock* block = blocks[i].get();
    const std::string module = "transformer_blocks." + std::to_string(i);
    const Tensors out = ctx.run_unit(
        i, {x, c, temb}, [block, ctx, module](const Tensors& in) { return block->forward(in, ctx, module); });
    if (block->context_pre_only()) {
      x = out.at(0);
      ctx.record(module, "out1", x);
    } else {
      c = out.at(0);
      x = out.at(1);
      ctx.record(module, "out0", c);
      ctx.record(module, "out1", x);
    }
  }
  x = norm_out->forward(x, temb);
  ctx.record("norm_out", "out0", x);
  x = proj_out->forward(x);
  ctx.record("proj_out", "out0", x);
  return unpatchify_2d(x, h, w, p, config_.out_channels);
}

at::Tensor SD3::noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& /*sigmas*/,
                           const Cond& cond, const ForwardContext& ctx) {
  // SD3 embeds the trajectory timesteps t in [0, 1000] directly; sigma is a
  // separate array (1-2 ulp away from t/1000) and is never used here.
  return forward(inputs_.cast_latents(latents), inputs_.cast_cond(cond.at("encoder_hidden_states")),
                 inputs_.cast_cond(cond.at("pooled_projections")), inputs_.cast_timestep(timesteps), ctx);
}

std::map<std::string, at::Tensor> SD3::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                         const std::string& extra_json, const ForwardContext& ctx) {
  const std::set<std::string> expected = {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep"};
  for (const auto& [name, tensor] : inputs)
    if (!expected.count(name))
      fail("sd3: unexpected input '{}' (the forward takes {})", name, fmt::join(expected, ", "));
  for (const std::string& name : expected)
    if (!inputs.count(name)) fail("sd3: missing input '{}' (the forward takes {})", name, fmt::join(expected, ", "));
  if (!extra_json.empty()) {
    // SD3 takes no non-tensor arguments; a sidecar's notes are ignored.
    json::error_code ec;
    const json::value extra = json::parse(extra_json, ec);
    if (ec || !extra.is_object()) fail("sd3: extra arguments must be a JSON object, got '{}'", extra_json);
  }
  return {{"output", forward(inputs.at("hidden_states"), inputs.at("encoder_hidden_states"),
                             inputs.at("pooled_projections"), inputs.at("timestep"), ctx)}};
}

std::vector<WrapUnit> SD3::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t i = 0; i < blocks.size(); ++i) units.push_back({"transformer_blocks." + std::to_string(i), blocks[i]});
  return units;
}

std::vector<std::string> SD3::default_lora_targets() const {
  // miles configs/sd3.py and flow_grpo train_sd3.py (docs/families.md §1.8).
  return {"attn.to_q",       "attn.to_k",       "attn.to_v",       "attn.to_out.0",
          "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"};
}

std::vector<int64_t> SD3::latent_shape(int64_t batch, const LatentGrid& grid) const {
  const int64_t p = config_.patch_size;
  if (grid.frames != 1) fail("sd3: an image model; the latent grid must have frames = 1, got {}", grid.frames);
  if (grid.height % p != 0 || grid.width % p != 0)
    fail("sd3: latent height and width {}x{} must be multiples of patch_size {}", grid.height, grid.width, p);
  if (grid.height / p > config_.pos_embed_max_size || grid.width / p > config_.pos_embed_max_size)
    fail("sd3: latent grid {}x{} (patches) exceeds pos_embed_max_size {}", grid.height / p, grid.width / p,
         config_.pos_embed_max_size);
  return {batch, config_.in_channels, grid.height, grid.width};
}

LatentRgbFactors SD3::latent_rgb_factors() const {
  if (config_.out_channels != 16) return {};
  // The SD3 VAE's 16 channels (ComfyUI's latent_formats.SD3).
  return {{{-0.0922f, -0.0175f, 0.0749f},
           {0.0311f, 0.0633f, 0.0954f},
           {0.1994f, 0.0927f, 0.0458f},
           {0.0856f, 0.0339f, 0.0902f},
           {0.0587f, 0.0272f, -0.0496f},
           {-0.0006f, 0.1104f, 0.0309f},
           {0.0978f, 0.0306f, 0.0427f},
           {-0.0042f, 0.1038f, 0.1358f},
           {-0.0194f, 0.002f, 0.0669f},
           {-0.0488f, 0.013f, -0.0268f},
           {0.0922f, 0.0988f, 0.0951f},
           {-0.0278f, 0.0524f, -0.0542f},
           {0.0332f, 0.0456f, 0.0895f},
           {-0.0069f, -0.003f, -0.081f},
           {-0.0596f, -0.0465f, -0.0293f},
           {-0.1448f, -0.1463f, -0.1189f}},
          {0.2394f, 0.2135f, 0.1925f},
          8,
          1,
          "ComfyUI's SD3 latent preview factors"};
}

std::vector<CondSpec> SD3::cond_spec() const {
  return {{"encoder_hidden_states", {config_.text_tokens, config_.joint_attention_dim}, c10::ScalarType::Float},
          {"pooled_projections", {config_.pooled_projection_dim}, c10::ScalarType::Float}};
}

std::string SD3Config::to_json() const {
  json::object o = json_config::diffusers_header("SD3Transformer2DModel");
  json_config::write_config(*this, o);
  return json::serialize(o);
}

}  // namespace ditrl::models
