#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/flux/bfl_checkpoint.hpp>
#include <ditrl/models/flux2/flux2.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <numeric>
#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

// The reference reads one set of ids for the whole batch: batch 0's of a [B, N, 4] tensor.
at::Tensor batch_ids(const at::Tensor& ids) {
  return ids.dim() == 3 ? ids.select(0, 0) : ids;
}

void check_ids(const at::Tensor& ids, const char* name, int64_t tokens, int64_t axes) {
  if (ids.is_floating_point() || (ids.dim() != 2 && ids.dim() != 3))
    fail("flux2: input '{}' must be an integer tensor [B, {}, {}] or [{}, {}] (the pipeline passes int64), got {} {}",
         name, tokens, axes, tokens, axes, c10::toString(ids.scalar_type()), c10::str(ids.sizes()));
  const at::Tensor one = batch_ids(ids);
  if (one.size(0) != tokens || one.size(1) != axes)
    fail("flux2: input '{}' has shape {}, expected [B, {}, {}] or [{}, {}]", name, c10::str(ids.sizes()), tokens, axes,
         tokens, axes);
}

}  // namespace

std::vector<std::string> Flux2Config::preset_names() {
  return {"tiny", "flux.2-dev", "flux.2-klein-4b", "flux.2-klein-9b"};
}

Flux2Config Flux2Config::preset(const std::string& name) {
  // Released transformer configs (docs/families.md §10.2); parameter counts in test_flux2.cpp.
  if (name == "flux.2-dev") return Flux2Config{};
  Flux2Config c;
  c.guidance_embeds = false;  // [klein] is not guidance-distilled
  if (name == "flux.2-klein-4b") {
    c.num_attention_heads = 24;
    c.num_layers = 5;
    c.num_single_layers = 20;
    c.joint_attention_dim = 7680;  // Qwen3-4B: 3 layers x 2560
    return c;
  }
  if (name == "flux.2-klein-9b") {
    c.num_attention_heads = 32;
    c.num_layers = 8;
    c.num_single_layers = 24;
    c.joint_attention_dim = 12288;  // Qwen3-8B: 3 layers x 4096
    return c;
  }
  if (name == "tiny") {
    // Every structural feature at hidden 64, as [klein] (real CFG, no guidance
    // embedding: the fixture's config has one).
    c.in_channels = 16;
    c.out_channels = 16;
    c.num_layers = 2;
    c.num_single_layers = 2;
    c.num_attention_heads = 4;
    c.attention_head_dim = 16;
    c.joint_attention_dim = 32;
    c.axes_dims_rope = {4, 4, 4, 4};
    c.text_tokens = 8;
    return c;
  }
  fail("unknown flux2 preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

Flux2Config Flux2Config::from_json(const std::string& text, const std::string& source) {
  Flux2Config c;
  json_config::read_config(json_config::parse_object(text, source), source, "Flux2Transformer2DModel", c);
  return json_config::validated(std::move(c), source);
}

void Flux2Config::validate() const {
  json_config::require_positive("flux2", *this);
  if (axes_dims_rope.size() != 4)
    fail("flux2 config: axes_dims_rope must have 4 entries (the pipeline's t, h, w, l ids), got {}",
         axes_dims_rope.size());
  for (int64_t d : axes_dims_rope)
    if (d <= 0 || d % 2 != 0)
      fail("flux2 config: axes_dims_rope [{}] must be positive and even", fmt::join(axes_dims_rope, ", "));
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  if (sum != attention_head_dim)
    fail("flux2 config: axes_dims_rope [{}] must sum to attention_head_dim {}", fmt::join(axes_dims_rope, ", "),
         attention_head_dim);
}

std::string Flux2Config::to_json() const {
  json::object o = json_config::diffusers_header("Flux2Transformer2DModel");
  json_config::write_config(*this, o);
  return json::serialize(o);
}

at::Tensor flux2_pack(const at::Tensor& latents) {
  return latents.flatten(2).permute({0, 2, 1});
}

at::Tensor flux2_unpack(const at::Tensor& tokens, int64_t height, int64_t width) {
  return tokens.permute({0, 2, 1}).reshape({tokens.size(0), tokens.size(2), height, width});
}

Flux2::Flux2(const Flux2Config& config, const FamilyOptions& options)
    : config_(config), inputs_(options.inputs), rope_(config.axes_dims_rope, static_cast<double>(config.rope_theta)) {
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  const int64_t dim = config_.inner_dim();
  time_guidance_embed = register_module(
      "time_guidance_embed",
      std::make_shared<TimeGuidanceEmbedding>(config_.timestep_guidance_channels, dim, config_.guidance_embeds, opts));
  double_stream_modulation_img =
      register_module("double_stream_modulation_img", std::make_shared<Flux2Modulation>(dim, 2, opts));
  double_stream_modulation_txt =
      register_module("double_stream_modulation_txt", std::make_shared<Flux2Modulation>(dim, 2, opts));
  single_stream_modulation =
      register_module("single_stream_modulation", std::make_shared<Flux2Modulation>(dim, 1, opts));
  x_embedder = register_module("x_embedder", std::make_shared<Linear>(config_.in_channels, dim, false, opts));
  context_embedder =
      register_module("context_embedder", std::make_shared<Linear>(config_.joint_attention_dim, dim, false, opts));
  auto doubles = register_module("transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks.push_back(
        doubles->register_module(std::to_string(i), std::make_shared<Flux2DoubleBlock>(config_, backend, opts)));
  auto singles = register_module("single_transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_single_layers; ++i)
    single_blocks.push_back(
        singles->register_module(std::to_string(i), std::make_shared<Flux2SingleBlock>(config_, backend, opts)));
  norm_out = register_module("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, config_.eps, opts, false));
  const int64_t p = config_.patch_size;
  proj_out = register_module("proj_out", std::make_shared<Linear>(dim, p * p * config_.out_channels, false, opts));
}

void Flux2::check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                         const at::Tensor& timestep, const at::Tensor& img_ids, const at::Tensor& txt_ids,
                         const at::Tensor& guidance) const {
  require_input_shape("flux2", hidden_states, "hidden_states", {-1, -1, config_.in_channels});
  const int64_t batch = hidden_states.size(0);
  require_input_shape("flux2", encoder_hidden_states, "encoder_hidden_states",
                      {batch, -1, config_.joint_attention_dim});
  require_input_shape("flux2", timestep, "timestep", {batch});
  const int64_t axes = static_cast<int64_t>(config_.axes_dims_rope.size());
  check_ids(img_ids, "img_ids", hidden_states.size(1), axes);
  check_ids(txt_ids, "txt_ids", encoder_hidden_states.size(1), axes);
  if (guidance.defined()) {
    if (!config_.guidance_embeds)
      fail(
          "flux2: input 'guidance' given, but this model has no guidance embedding (guidance_embeds = false: "
          "FLUX.2 [klein] takes real CFG, not an embedded scale)");
    require_input_shape("flux2", guidance, "guidance", {batch});
  }
  const c10::ScalarType weights = x_embedder->weight.scalar_type();
  if (hidden_states.scalar_type() != weights)
    fail("flux2: input 'hidden_states' is {} but the x_embedder weights are {} (pass inputs in the forward dtype)",
         precision::dtype_name(hidden_states.scalar_type()), precision::dtype_name(weights));
}

at::Tensor Flux2::forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                          const at::Tensor& timestep, const at::Tensor& img_ids, const at::Tensor& txt_ids,
                          const at::Tensor& guidance, const ForwardContext& ctx) {
  check_inputs(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance);
  const c10::ScalarType dtype = hidden_states.scalar_type();
  const int64_t text_len = encoder_hidden_states.size(1);
  // sigma -> 1000 sigma in the hidden dtype, as the reference scales it.
  const at::Tensor t = timestep.to(dtype) * 1000;
  const at::Tensor g = guidance.defined() ? guidance.to(dtype) * 1000 : at::Tensor();
  ctx.record("time_guidance_embed", "in0", t);
  const at::Tensor temb = time_guidance_embed->forward(t, g);
  ctx.record("time_guidance_embed", "out0", temb);
  const at::Tensor mod_img = double_stream_modulation_img->forward(temb);
  const at::Tensor mod_txt = double_stream_modulation_txt->forward(temb);
  const at::Tensor mod_single = single_stream_modulation->forward(temb);
  ctx.record("double_stream_modulation_img", "out0", mod_img);
  ctx.record("double_stream_modulation_txt", "out0", mod_txt);
  ctx.record("single_stream_modulation", "out0", mod_single);
  at::Tensor x = x_embedder->forward(hidden_states);
  ctx.record("x_embedder", "out0", x);
  at::Tensor c = context_embedder->forward(encoder_hidden_states);
  ctx.record("context_embedder", "out0", c);
  // Tables are built where the model runs, from the ids the reference reads.
  const auto [img_cos, img_sin] = rope_.cos_sin(batch_ids(img_ids).to(x.device()));
  ctx.record("pos_embed", "out0", img_cos);
  ctx.record("pos_embed", "out1", img_sin);
  const auto [txt_cos, txt_sin] = rope_.cos_sin(batch_ids(txt_ids).to(x.device()));
  ctx.record("pos_embed", "out0", txt_cos);
  ctx.record("pos_embed", "out1", txt_sin);

  Tap* tap = ctx.tap;
  for (size_t i = 0; i < blocks.size(); ++i) {
    Flux2DoubleBlock* block = blocks[i].get();
    // Names are built only when a tap listens; the unit function may be
    // called again in backward, so it holds copies, not references.
    const std::string module = tap ? "transformer_blocks." + std::to_string(i) : std::string();
    const Tensors out =
        ctx.run_unit(i, {x, c, mod_img, mod_txt, img_cos, img_sin, txt_cos, txt_sin},
                     [block, tap, module](const Tensors& in) { return block->forward(in, tap, module); });
    c = out.at(0);
    x = out.at(1);
    ctx.record(module, "out0", c);
    ctx.record(module, "out1", x);
  }
  at::Tensor h = at::cat({c, x}, 1);
  const at::Tensor cos = at::cat({txt_cos, img_cos}, 0), sin = at::cat({txt_sin, img_sin}, 0);
  for (size_t i = 0; i < single_blocks.size(); ++i) {
    Flux2SingleBlock* block = single_blocks[i].get();
    h = ctx.run_unit(blocks.size() + i, {h, mod_single, cos, sin},
                     [block](const Tensors& in) { return block->forward(in); })
            .at(0);
    if (tap) ctx.record("single_transformer_blocks." + std::to_string(i), "out0", h);
  }
  x = h.slice(1, text_len);
  x = norm_out->forward(x, temb);
  ctx.record("norm_out", "out0", x);
  x = proj_out->forward(x);
  ctx.record("proj_out", "out0", x);
  return x;
}

at::Tensor Flux2::noise_pred(const at::Tensor& latents, const at::Tensor& /*timesteps*/, const at::Tensor& sigmas,
                             const Cond& cond, const ForwardContext& ctx) {
  // FLUX.2 reads the sigma snapshot in [0, 1]; the trajectory timesteps are never read.
  require_input_shape("flux2", latents, "latents", {-1, config_.in_channels, -1, -1});
  const int64_t height = latents.size(2), width = latents.size(3);
  const at::Tensor text = inputs_.cast_cond(cond.at("encoder_hidden_states"));
  const at::Tensor guidance = config_.guidance_embeds ? cond.at("guidance") : at::Tensor();
  const at::Tensor out = forward(flux2_pack(inputs_.cast_latents(latents)), text, inputs_.cast_timestep(sigmas),
                                 flux2_image_ids(height, width), flux2_text_ids(text.size(1)), guidance, ctx);
  return flux2_unpack(out, height, width);
}

std::map<std::string, at::Tensor> Flux2::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                           const std::string& extra_json, const ForwardContext& ctx) {
  const std::set<std::string> required = {"hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids"};
  const std::set<std::string> optional = {"guidance"};
  for (const auto& [name, tensor] : inputs)
    if (!required.count(name) && !optional.count(name))
      fail("flux2: unexpected input '{}' (the forward takes {}, optionally {})", name, fmt::join(required, ", "),
           fmt::join(optional, ", "));
  for (const std::string& name : required)
    if (!inputs.count(name)) fail("flux2: missing input '{}' (the forward takes {})", name, fmt::join(required, ", "));
  json::error_code ec;
  const json::value extra = json::parse(extra_json.empty() ? "{}" : extra_json, ec);
  if (ec || !extra.is_object()) fail("flux2: extra arguments must be a JSON object, got '{}'", extra_json);
  for (const auto& [key, value] : extra.get_object()) {
    const std::string k(key);
    if (k.size() < 5 || k.compare(k.size() - 5, 5, "_note") != 0)
      fail("flux2: unknown extra argument '{}' (the forward takes none)", k);
  }
  const at::Tensor guidance = inputs.count("guidance") ? inputs.at("guidance") : at::Tensor();
  return {{"output", forward(inputs.at("hidden_states"), inputs.at("encoder_hidden_states"), inputs.at("timestep"),
                             inputs.at("img_ids"), inputs.at("txt_ids"), guidance, ctx)}};
}

std::vector<WrapUnit> Flux2::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t i = 0; i < blocks.size(); ++i) units.push_back({"transformer_blocks." + std::to_string(i), blocks[i]});
  for (size_t i = 0; i < single_blocks.size(); ++i)
    units.push_back({"single_transformer_blocks." + std::to_string(i), single_blocks[i]});
  return units;
}

const BflLayout& flux2_bfl_layout() {
  // diffusers' convert_flux2_transformer_checkpoint_to_diffusers, as a table;
  // the single blocks keep their fused projection (to_qkv_mlp_proj).
  static const BflLayout layout =
      bfl_layout("time_guidance_embed", {{{"double_stream_modulation_img.lin", {"double_stream_modulation_img.linear"}},
                                          {"double_stream_modulation_txt.lin", {"double_stream_modulation_txt.linear"}},
                                          {"single_stream_modulation.lin", {"single_stream_modulation.linear"}}},
                                         {{"img_mlp.0", {"ff.linear_in"}},
                                          {"img_mlp.2", {"ff.linear_out"}},
                                          {"txt_mlp.0", {"ff_context.linear_in"}},
                                          {"txt_mlp.2", {"ff_context.linear_out"}}},
                                         {{"linear1", {"attn.to_qkv_mlp_proj"}}, {"linear2", {"attn.to_out"}}}});
  return layout;
}

std::map<std::string, std::vector<io::StoredRows>> Flux2::checkpoint_regrouping(const io::Checkpoint& c) const {
  return bfl_regrouping(c, flux2_bfl_layout());
}

std::vector<std::string> Flux2::default_lora_targets() const {
  // Flow-Factory's FLUX.2 [klein] default (models/flux/flux2_klein.py) as PEFT
  // matches it: every projection of the double blocks and the single blocks'
  // fused input projection (its "attn.to_out.0" names no single-block layer:
  // their to_out is one linear). docs/families.md §10.8.
  return {
      "to_q",           "to_k",       "to_v",         "to_out.0",      "add_q_proj",           "add_k_proj",
      "add_v_proj",     "to_add_out", "ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
      "to_qkv_mlp_proj"};
}

double Flux2::guidance_scale(const GuidanceOptions& g, double /*timestep*/) const {
  if (config_.guidance_embeds) return g.true_cfg_scale ? *g.true_cfg_scale : 1.0;
  return g.scale;
}

std::vector<int64_t> Flux2::latent_shape(int64_t batch, const LatentGrid& grid) const {
  if (grid.frames != 1) fail("flux2: an image model; the latent grid must have frames = 1, got {}", grid.frames);
  if (grid.height % 2 != 0 || grid.width % 2 != 0)
    fail("flux2: latent grid {}x{} must be even (the pipeline patchifies the VAE latent 2x2)", grid.height, grid.width);
  const int64_t p = config_.patch_size;
  if (config_.in_channels != p * p * config_.out_channels)
    fail(
        "flux2: sampling needs in_channels ({}) = patch_size^2 x out_channels ({}) so that the velocity has the "
        "latent's shape",
        config_.in_channels, p * p * config_.out_channels);
  return {batch, config_.in_channels, grid.height / 2, grid.width / 2};
}

std::vector<CondSpec> Flux2::cond_spec() const {
  // The pipelines pass no text mask: padded tokens attend like the others.
  return {{"encoder_hidden_states", {config_.text_tokens, config_.joint_attention_dim}, c10::ScalarType::Float}};
}

}  // namespace ditrl::models
