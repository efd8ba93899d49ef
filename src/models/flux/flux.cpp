#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/flux/bfl_checkpoint.hpp>
#include <ditrl/models/flux/flux.hpp>
#include <ditrl/models/packed_latents.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <numeric>
#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

constexpr double kNormEps = 1e-6;
// FluxPipeline's VAE latent: 16 channels, packed 2x2 into the model's 64.
constexpr int64_t kPack = 2;

AttentionConfig flux_attention(const FluxConfig& config, AttentionBackend backend) {
  AttentionConfig ac;
  ac.dim = config.inner_dim();
  ac.heads = config.num_attention_heads;
  ac.head_dim = config.attention_head_dim;
  ac.qk_norm = QKNorm::PerHead;
  ac.rms_flavour = RmsFlavour::Torch;  // torch.nn.RMSNorm
  ac.eps = kNormEps;
  ac.order = JointOrder::TextFirst;
  ac.backend = backend;
  return ac;
}

// RoPE on the (B, H, L, Dh) streams, rows [begin, begin + L) of the tables.
QKRotary rotary(const at::Tensor& cos, const at::Tensor& sin, int64_t begin) {
  return [cos, sin, begin](at::Tensor& q, at::Tensor& k) {
    const at::Tensor c = cos.narrow(0, begin, q.size(2)), s = sin.narrow(0, begin, q.size(2));
    q = FluxRope::apply(q, c, s);
    k = FluxRope::apply(k, c, s);
  };
}

void record(Tap* tap, const std::string& module, const char* name, const at::Tensor& t) {
  if (!tap) return;
  const ForwardContext ctx{nullptr, tap};
  ctx.record(module, name, t);
}

}  // namespace

std::vector<std::string> FluxConfig::preset_names() {
  return {"tiny", "tiny-schnell", "flux.1-dev", "flux.1-schnell"};
}

FluxConfig FluxConfig::preset(const std::string& name) {
  if (name == "flux.1-dev") return FluxConfig{};
  if (name == "flux.1-schnell") {
    // black-forest-labs/FLUX.1-schnell: the dev architecture without the
    // guidance embedder; its model card runs FluxPipeline with
    // max_sequence_length = 256 T5 tokens.
    FluxConfig c;
    c.guidance_embeds = false;
    c.text_tokens = 256;
    return c;
  }
  if (name == "tiny" || name == "tiny-schnell") {
    // Every structural feature at hidden 64: two double and two single
    // blocks, three RoPE axes of different widths; "tiny" embeds the
    // guidance scale as FLUX.1-dev does, "tiny-schnell" does not.
    FluxConfig c;
    c.in_channels = 64;
    c.out_channels = 64;
    c.num_layers = 2;
    c.num_single_layers = 2;
    c.num_attention_heads = 4;
    c.attention_head_dim = 16;
    c.joint_attention_dim = 32;
    c.pooled_projection_dim = 24;
    c.axes_dims_rope = {4, 6, 6};
    c.guidance_embeds = name == "tiny";
    c.text_tokens = 8;
    return c;
  }
  fail("unknown flux preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

FluxConfig FluxConfig::from_json(const std::string& text, const std::string& source) {
  FluxConfig c;
  json_config::read_config(json_config::parse_object(text, source), source, "FluxTransformer2DModel", c);
  return json_config::validated(std::move(c), source);
}

void FluxConfig::validate() const {
  json_config::require_positive("flux", *this);
  if (num_layers < 0 || num_single_layers < 0)
    fail("flux config: num_layers ({}) and num_single_layers ({}) must not be negative", num_layers, num_single_layers);
  if (axes_dims_rope.size() != 3)
    fail("flux config: axes_dims_rope must have 3 entries (FLUX.1's txt/img ids have 3 axes), got {}",
         axes_dims_rope.size());
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  if (sum != attention_head_dim)
    fail("flux config: axes_dims_rope [{}] must sum to attention_head_dim {}", fmt::join(axes_dims_rope, ", "),
         attention_head_dim);
}

std::string FluxConfig::to_json() const {
  json::object o = json_config::diffusers_header("FluxTransformer2DModel");
  json_config::write_config(*this, o);
  return json::serialize(o);
}

at::Tensor flux_image_ids(int64_t h, int64_t w, const at::TensorOptions& options) {
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(options.device());
  const at::Tensor rows = at::arange(h, f32).view({h, 1}).expand({h, w});
  const at::Tensor cols = at::arange(w, f32).view({1, w}).expand({h, w});
  return at::stack({at::zeros({h, w}, f32), rows, cols}, -1).reshape({h * w, 3}).to(options.dtype());
}

FluxBlock::FluxBlock(const FluxConfig& config, AttentionBackend backend, const at::TensorOptions& options) {
  const int64_t dim = config.inner_dim();
  norm1 = register_module("norm1", std::make_shared<AdaLayerNormZero>(dim, 6, options));
  norm1_context = register_module("norm1_context", std::make_shared<AdaLayerNormZero>(dim, 6, options));
  AttentionConfig ac = flux_attention(config, backend);
  ac.joint = true;
  ac.context_out = true;
  attn = register_module("attn", std::make_shared<Attention>(ac, options));
  ff = register_module("ff", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
  ff_context = register_module("ff_context", std::make_shared<FeedForward>(dim, 4 * dim, dim, true, options));
}

Tensors FluxBlock::forward(const Tensors& inputs, Tap* tap, const std::string& module) {
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& c = inputs.at(1);
  const at::Tensor& temb = inputs.at(2);
  const at::Tensor& cos = inputs.at(3);
  const at::Tensor& sin = inputs.at(4);
  // (shift, scale, gate) for attention, then for the MLP.
  const std::vector<at::Tensor> m = norm1->forward(temb);
  const std::vector<at::Tensor> cm = norm1_context->forward(temb);
  const at::Tensor x_in = modulate(layer_norm(x, kNormEps), m[0], m[1]);
  const at::Tensor c_in = modulate(layer_norm(c, kNormEps), cm[0], cm[1]);
  record(tap, module + ".norm1", "out0", x_in);
  const int64_t text_len = c.size(1);
  const auto [x_attn, c_attn] = attn->joint_attention(x_in, c_in, {}, rotary(cos, sin, text_len), rotary(cos, sin, 0));
  record(tap, module + ".attn", "out0", x_attn);
  record(tap, module + ".attn", "out1", c_attn);
  at::Tensor h = x + m[2].unsqueeze(1) * x_attn;
  h = h + m[5].unsqueeze(1) * ff->forward(modulate(layer_norm(h, kNormEps), m[3], m[4]));
  at::Tensor e = c + cm[2].unsqueeze(1) * c_attn;
  e = e + cm[5].unsqueeze(1) * ff_context->forward(modulate(layer_norm(e, kNormEps), cm[3], cm[4]));
  if (e.scalar_type() == at::kHalf) e = e.clip(-65504, 65504);
  return {e, h};
}

FluxSingleBlock::FluxSingleBlock(const FluxConfig& config, AttentionBackend backend, const at::TensorOptions& options) {
  const int64_t dim = config.inner_dim();
  norm = register_module("norm", std::make_shared<AdaLayerNormZero>(dim, 3, options));
  proj_mlp = register_module("proj_mlp", std::make_shared<Linear>(dim, 4 * dim, true, options));
  proj_out = register_module("proj_out", std::make_shared<Linear>(dim + 4 * dim, dim, true, options));
  AttentionConfig ac = flux_attention(config, backend);
  ac.pre_only = true;
  attn = register_module("attn", std::make_shared<Attention>(ac, options));
}

Tensors FluxSingleBlock::forward(const Tensors& inputs, Tap* tap, const std::string& module) {
  const at::Tensor& h = inputs.at(0);
  const at::Tensor& temb = inputs.at(1);
  const at::Tensor& cos = inputs.at(2);
  const at::Tensor& sin = inputs.at(3);
  const std::vector<at::Tensor> m = norm->forward(temb);  // shift, scale, gate
  const at::Tensor h_in = modulate(layer_norm(h, kNormEps), m[0], m[1]);
  const at::Tensor mlp = activate(proj_mlp->forward(h_in), Activation::GeluTanh);
  const at::Tensor a = attn->self_attention(h_in, {}, rotary(cos, sin, 0));
  record(tap, module + ".attn", "out0", a);
  at::Tensor out = h + m[2].unsqueeze(1) * proj_out->forward(at::cat({a, mlp}, 2));
  if (out.scalar_type() == at::kHalf) out = out.clip(-65504, 65504);
  return {out};
}

Flux::Flux(const FluxConfig& config, const FamilyOptions& options)
    : config_(config), inputs_(options.inputs), rope_(config.axes_dims_rope) {
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  const int64_t dim = config_.inner_dim();
  auto time_text = register_module("time_text_embed", std::make_shared<Container>());
  timestep_embedder = time_text->register_module("timestep_embedder",
                                                 std::make_shared<MLPEmbedding>(256, dim, dim, Activation::SiLU, opts));
  if (config_.guidance_embeds)
    guidance_embedder = time_text->register_module(
        "guidance_embedder", std::make_shared<MLPEmbedding>(256, dim, dim, Activation::SiLU, opts));
  text_embedder = time_text->register_module(
      "text_embedder", std::make_shared<MLPEmbedding>(config_.pooled_projection_dim, dim, dim, Activation::SiLU, opts));
  context_embedder =
      register_module("context_embedder", std::make_shared<Linear>(config_.joint_attention_dim, dim, true, opts));
  x_embedder = register_module("x_embedder", std::make_shared<Linear>(config_.in_channels, dim, true, opts));
  auto list = register_module("transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<FluxBlock>(config_, backend, opts)));
  auto singles = register_module("single_transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_single_layers; ++i)
    single_blocks.push_back(
        singles->register_module(std::to_string(i), std::make_shared<FluxSingleBlock>(config_, backend, opts)));
  norm_out = register_module("norm_out", std::make_shared<AdaLayerNormContinuous>(dim, dim, kNormEps, opts));
  const int64_t p = config_.patch_size;
  proj_out = register_module("proj_out", std::make_shared<Linear>(dim, p * p * config_.out_channels, true, opts));
}

void Flux::check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                        const at::Tensor& pooled_projections, const at::Tensor& timestep, const at::Tensor& img_ids,
                        const at::Tensor& txt_ids, const at::Tensor& guidance) const {
  require_input_shape("flux", hidden_states, "hidden_states", {-1, -1, config_.in_channels});
  const int64_t batch = hidden_states.size(0);
  require_input_shape("flux", encoder_hidden_states, "encoder_hidden_states", {batch, -1, config_.joint_attention_dim});
  require_input_shape("flux", pooled_projections, "pooled_projections", {batch, config_.pooled_projection_dim});
  require_input_shape("flux", timestep, "timestep", {batch});
  // FluxPipeline passes 2-D ids; diffusers still accepts (deprecated) 3-D ones but ditrl does not.
  require_input_shape("flux", img_ids, "img_ids", {hidden_states.size(1), 3});
  require_input_shape("flux", txt_ids, "txt_ids", {encoder_hidden_states.size(1), 3});
  if (config_.guidance_embeds && !guidance.defined())
    fail(
        "flux: this model embeds the guidance scale (guidance_embeds = true, FLUX.1-dev): input 'guidance' [B] "
        "is required");
  if (!config_.guidance_embeds && guidance.defined())
    fail(
        "flux: input 'guidance' given, but this model has no guidance embedder (guidance_embeds = false, "
        "FLUX.1-schnell)");
  if (guidance.defined()) require_input_shape("flux", guidance, "guidance", {batch});
  const c10::ScalarType weights = x_embedder->weight.scalar_type();
  if (hidden_states.scalar_type() != weights)
    fail("flux: input 'hidden_states' is {} but the x_embedder weights are {} (pass inputs in the forward dtype)",
         precision::dtype_name(hidden_states.scalar_type()), precision::dtype_name(weights));
}

at::Tensor Flux::time_text_embedding(const at::Tensor& timestep, const at::Tensor& guidance,
                                     const at::Tensor& pooled_projections, c10::ScalarType hidden,
                                     const ForwardContext& ctx) const {
  // sigma and the guidance scale times 1000 in the hidden dtype, then the
  // plain sinusoid, cast to the pooled projection's dtype.
  const at::Tensor t = timestep.to(hidden) * 1000;
  ctx.record("time_text_embed", "in0", t);
  const c10::ScalarType pooled = pooled_projections.scalar_type();
  at::Tensor temb = timestep_embedder->forward(timestep_sinusoid(t, SinusoidOptions{}).to(pooled));
  if (guidance_embedder) {
    const at::Tensor g = guidance.to(hidden) * 1000;
    temb = temb + guidance_embedder->forward(timestep_sinusoid(g, SinusoidOptions{}).to(pooled));
  }
  return temb + text_embedder->forward(pooled_projections);
}

at::Tensor Flux::forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                         const at::Tensor& pooled_projections, const at::Tensor& timestep, const at::Tensor& img_ids,
                         const at::Tensor& txt_ids, const at::Tensor& guidance, const ForwardContext& ctx) {
  check_inputs(hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, guidance);
  at::Tensor x = x_embedder->forward(hidden_states);
  ctx.record("x_embedder", "out0", x);
  const at::Tensor temb = time_text_embedding(timestep, guidance, pooled_projections, x.scalar_type(), ctx);
  ctx.record("time_text_embed", "out0", temb);
  at::Tensor c = context_embedder->forward(encoder_hidden_states);
  ctx.record("context_embedder", "out0", c);
  const auto [cos, sin] = rope_.cos_sin(at::cat({txt_ids, img_ids}, 0));
  const int64_t text_len = c.size(1);

  Tap* tap = ctx.tap;
  for (size_t i = 0; i < blocks.size(); ++i) {
    FluxBlock* block = blocks[i].get();
    // Names are built only when a tap listens; the unit function may be
    // called again in backward, so it holds copies, not references.
    const std::string module = tap ? "transformer_blocks." + std::to_string(i) : std::string();
    const Tensors out = ctx.run_unit(
        i, {x, c, temb, cos, sin}, [block, tap, module](const Tensors& in) { return block->forward(in, tap, module); });
    c = out.at(0);
    x = out.at(1);
    ctx.record(module, "out0", c);
    ctx.record(module, "out1", x);
  }
  // The single-stream blocks carry [text | image] as one sequence; the
  // reference re-joins and splits it around each block, which moves no value.
  at::Tensor joint = at::cat({c, x}, 1);
  for (size_t i = 0; i < single_blocks.size(); ++i) {
    FluxSingleBlock* block = single_blocks[i].get();
    const std::string module = tap ? "single_transformer_blocks." + std::to_string(i) : std::string();
    joint = ctx.run_unit(blocks.size() + i, {joint, temb, cos, sin},
                         [block, tap, module](const Tensors& in) { return block->forward(in, tap, module); })
                .at(0);
    ctx.record(module, "out0", joint.narrow(1, 0, text_len));
    ctx.record(module, "out1", joint.narrow(1, text_len, joint.size(1) - text_len));
  }
  x = joint.narrow(1, text_len, joint.size(1) - text_len);
  x = norm_out->forward(x, temb);
  ctx.record("norm_out", "out0", x);
  x = proj_out->forward(x);
  ctx.record("proj_out", "out0", x);
  return x;
}

at::Tensor Flux::noise_pred(const at::Tensor& latents, const at::Tensor& /*timesteps*/, const at::Tensor& sigmas,
                            const Cond& cond, const ForwardContext& ctx) {
  // FLUX reads the sigma snapshot in [0, 1] (the pipeline's t / 1000); the
  // trajectory timesteps are never read.
  require_input_shape("flux", latents, "latents", {-1, config_.in_channels / (kPack * kPack), -1, -1});
  if (latents.size(2) % kPack != 0 || latents.size(3) % kPack != 0)
    fail("flux: latent height and width {}x{} must be even (2x2 packing)", latents.size(2), latents.size(3));
  const at::Tensor hidden = pack_latents(inputs_.cast_latents(latents), kPack);
  const at::Tensor text = inputs_.cast_cond(cond.at("encoder_hidden_states"));
  // The pipeline's ids: image (0, row, col) and text zeros, in the latents' dtype.
  const at::TensorOptions ids = hidden.options();
  const at::Tensor img_ids = flux_image_ids(latents.size(2) / kPack, latents.size(3) / kPack, ids);
  const at::Tensor txt_ids = at::zeros({text.size(1), 3}, ids);
  const at::Tensor guidance = config_.guidance_embeds ? cond.at("guidance") : at::Tensor();
  const at::Tensor out = forward(hidden, text, inputs_.cast_cond(cond.at("pooled_projections")),
                                 inputs_.cast_timestep(sigmas), img_ids, txt_ids, guidance, ctx);
  return unpack_latents(out, latents.size(2), latents.size(3), kPack);
}

std::map<std::string, at::Tensor> Flux::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                          const std::string& extra_json, const ForwardContext& ctx) {
  std::set<std::string> required = {
      "hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids"};
  if (config_.guidance_embeds) required.insert("guidance");
  for (const auto& [name, tensor] : inputs)
    if (!required.count(name))
      fail("flux: unexpected input '{}' (this model's forward takes {})", name, fmt::join(required, ", "));
  for (const std::string& name : required)
    if (!inputs.count(name))
      fail("flux: missing input '{}' (this model's forward takes {})", name, fmt::join(required, ", "));
  if (!extra_json.empty()) {
    // FLUX takes no non-tensor arguments; a sidecar's notes are ignored.
    json::error_code ec;
    const json::value extra = json::parse(extra_json, ec);
    if (ec || !extra.is_object()) fail("flux: extra arguments must be a JSON object, got '{}'", extra_json);
  }
  const at::Tensor guidance = config_.guidance_embeds ? inputs.at("guidance") : at::Tensor();
  return {{"output",
           forward(inputs.at("hidden_states"), inputs.at("encoder_hidden_states"), inputs.at("pooled_projections"),
                   inputs.at("timestep"), inputs.at("img_ids"), inputs.at("txt_ids"), guidance, ctx)}};
}

std::vector<WrapUnit> Flux::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t i = 0; i < blocks.size(); ++i) units.push_back({"transformer_blocks." + std::to_string(i), blocks[i]});
  for (size_t i = 0; i < single_blocks.size(); ++i)
    units.push_back({"single_transformer_blocks." + std::to_string(i), single_blocks[i]});
  return units;
}

const BflLayout& flux1_bfl_layout() {
  // diffusers' convert_flux_transformer_checkpoint_to_diffusers, as a table.
  static const BflLayout layout = bfl_layout(
      "time_text_embed", {{{"vector_in.in_layer", {"time_text_embed.text_embedder.linear_1"}},
                           {"vector_in.out_layer", {"time_text_embed.text_embedder.linear_2"}}},
                          {{"img_mod.lin", {"norm1.linear"}},
                           {"txt_mod.lin", {"norm1_context.linear"}},
                           {"img_mlp.0", {"ff.net.0.proj"}},
                           {"img_mlp.2", {"ff.net.2"}},
                           {"txt_mlp.0", {"ff_context.net.0.proj"}},
                           {"txt_mlp.2", {"ff_context.net.2"}}},
                          {{"modulation.lin", {"norm.linear"}},
                           {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}, BflRows::qkv_mlp},
                           {"linear2", {"proj_out"}}}});
  return layout;
}

std::map<std::string, std::vector<io::StoredRows>> Flux::checkpoint_regrouping(const io::Checkpoint& c) const {
  return bfl_regrouping(c, flux1_bfl_layout());
}

std::vector<std::string> Flux::default_lora_targets() const {
  // flow_grpo's FLUX LoRA (scripts/train_flux.py target_modules): the
  // attention projections of both block kinds.
  return {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
}

double Flux::guidance_scale(const GuidanceOptions& g, double /*timestep*/) const {
  return g.true_cfg_scale ? *g.true_cfg_scale : 1.0;
}

std::vector<int64_t> Flux::latent_shape(int64_t batch, const LatentGrid& grid) const {
  if (grid.frames != 1) fail("flux: an image model; the latent grid must have frames = 1, got {}", grid.frames);
  if (grid.height % kPack != 0 || grid.width % kPack != 0)
    fail("flux: latent grid {}x{} must be even (2x2 packing)", grid.height, grid.width);
  if (config_.patch_size != 1 || config_.in_channels % (kPack * kPack) != 0 ||
      config_.out_channels != config_.in_channels)
    fail(
        "flux: sampling needs patch_size 1 and out_channels = in_channels (a multiple of 4: the pipeline's 2x2 "
        "packing), got patch_size {}, in_channels {}, out_channels {}",
        config_.patch_size, config_.in_channels, config_.out_channels);
  return {batch, config_.in_channels / (kPack * kPack), grid.height, grid.width};
}

LatentRgbFactors Flux::latent_rgb_factors() const {
  if (config_.in_channels != kPack * kPack * 16) return {};
  // ComfyUI's latent_formats.Flux.
  return {{{-0.0346f, 0.0244f, 0.0681f},
           {0.0034f, 0.0210f, 0.0687f},
           {0.0275f, -0.0668f, -0.0433f},
           {-0.0174f, 0.0160f, 0.0617f},
           {0.0859f, 0.0721f, 0.0329f},
           {0.0004f, 0.0383f, 0.0115f},
           {0.0405f, 0.0861f, 0.0915f},
           {-0.0236f, -0.0185f, -0.0259f},
           {-0.0245f, 0.0250f, 0.1180f},
           {0.1008f, 0.0755f, -0.0421f},
           {-0.0515f, 0.0201f, 0.0011f},
           {0.0428f, -0.0012f, -0.0036f},
           {0.0817f, 0.0765f, 0.0749f},
           {-0.1264f, -0.0522f, -0.1103f},
           {-0.0280f, -0.0881f, -0.0499f},
           {-0.1262f, -0.0982f, -0.0778f}},
          {-0.0329f, -0.0718f, -0.0851f},
          8,
          1,
          "ComfyUI's FLUX.1 latent preview factors"};
}

std::vector<CondSpec> Flux::cond_spec() const {
  return {{"encoder_hidden_states", {config_.text_tokens, config_.joint_attention_dim}, c10::ScalarType::Float},
          {"pooled_projections", {config_.pooled_projection_dim}, c10::ScalarType::Float}};
}

}  // namespace ditrl::models
