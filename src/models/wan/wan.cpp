#include <ditrl/error.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/wan/wan.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

WanConfig real_config(int64_t layers, int64_t heads, int64_t ffn_dim, int64_t channels, int64_t experts) {
  WanConfig c;
  c.num_layers = layers;
  c.num_attention_heads = heads;
  c.ffn_dim = ffn_dim;
  c.in_channels = channels;
  c.out_channels = channels;
  c.experts = experts;
  return c;
}

WanConfig tiny_config(int64_t experts) {
  WanConfig c;
  c.num_attention_heads = 2;
  c.attention_head_dim = 32;  // rope split 12 / 10 / 10
  c.text_dim = 32;
  c.ffn_dim = 128;
  c.num_layers = 2;
  c.text_tokens = 8;
  c.experts = experts;
  return c;
}

// diffusers FP32LayerNorm without affine, applied to x.float().
at::Tensor fp32_layer_norm(const at::Tensor& x, double eps) {
  return layer_norm(x.to(at::kFloat), eps);
}

}  // namespace

std::vector<std::string> WanConfig::preset_names() {
  return {"tiny", "tiny-a14b", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"};
}

WanConfig WanConfig::preset(const std::string& name) {
  // docs/families.md §2.2 (diffusers' convert_wan_to_diffusers.py configs).
  if (name == "wan2.1-t2v-1.3b") return real_config(30, 12, 8960, 16, 1);
  if (name == "wan2.1-t2v-14b") return real_config(40, 40, 13824, 16, 1);
  if (name == "wan2.2-t2v-a14b") return real_config(40, 40, 13824, 16, 2);
  if (name == "wan2.2-ti2v-5b") return real_config(30, 24, 14336, 48, 1);
  if (name == "tiny") return tiny_config(1);
  if (name == "tiny-a14b") return tiny_config(2);
  fail("unknown wan preset '{}': known presets are {}", name, fmt::join(preset_names(), ", "));
}

WanConfig WanConfig::from_json(const std::string& text, const std::string& source) {
  WanConfig c;
  json_config::read_config(json_config::parse_object(text, source), source, "WanTransformer3DModel", c);
  return json_config::validated(std::move(c), source);
}

void WanConfig::validate() const {
  json_config::require_positive("wan", *this);
  if (patch_size.size() != 3 || patch_size[0] <= 0 || patch_size[1] <= 0 || patch_size[2] <= 0)
    fail("wan config: patch_size must be three positive integers (t, h, w), got [{}]", fmt::join(patch_size, ", "));
  if (attention_head_dim % 2 != 0)
    fail("wan config: attention_head_dim {} must be even (RoPE pairs)", attention_head_dim);
  if (experts != 1 && experts != 2) fail("wan config: experts must be 1 or 2 (Wan2.2 A14B), got {}", experts);
  if (!(boundary_ratio > 0 && boundary_ratio < 1))
    fail("wan config: boundary_ratio must be in (0, 1), got {}", boundary_ratio);
}

WanBlock::WanBlock(const WanConfig& config, AttentionBackend backend, const at::TensorOptions& options)
    : dim_(config.inner_dim()), eps_(config.eps) {
  AttentionConfig ac;
  ac.dim = dim_;
  ac.heads = config.num_attention_heads;
  ac.head_dim = config.attention_head_dim;
  ac.qk_norm = QKNorm::AcrossHeads;
  ac.rms_flavour = RmsFlavour::Torch;
  ac.eps = config.eps;
  ac.backend = backend;
  attn1 = register_module("attn1", std::make_shared<Attention>(ac, options));
  attn2 = register_module("attn2", std::make_shared<Attention>(ac, options));
  if (config.cross_attn_norm)
    norm2 = register_module("norm2",
                            std::make_shared<LayerNorm>(dim_, config.eps, /*affine=*/true, /*fp32=*/true, options));
  ffn = register_module("ffn", std::make_shared<FeedForward>(dim_, config.ffn_dim, dim_, true, options));
  scale_shift_table = register_parameter("scale_shift_table", at::empty({1, 6, dim_}, options));
}

// diffusers WanTransformerBlock.forward, op for op.
Tensors WanBlock::forward(const Tensors& inputs, Tap* tap, const std::string& module, const Ulysses* ulysses) {
  const auto record = [tap, &module](const char* sub, const at::Tensor& value) {
    if (tap) ForwardContext{nullptr, tap}.record(module + sub, "out0", value);
  };
  const at::Tensor& x = inputs.at(0);
  const at::Tensor& context = inputs.at(1);
  const at::Tensor& timestep_proj = inputs.at(2);
  const at::Tensor& cos = inputs.at(3);
  const at::Tensor& sin = inputs.at(4);
  const c10::ScalarType dtype = x.scalar_type();
  // shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa: fp32.
  std::vector<at::Tensor> m;
  if (timestep_proj.dim() == 4) {
    m = (scale_shift_table.unsqueeze(0) + timestep_proj.to(at::kFloat)).chunk(6, 2);
    for (at::Tensor& t : m) t = t.squeeze(2);
  } else {
    m = (scale_shift_table + timestep_proj.to(at::kFloat)).chunk(6, 1);
  }
  const QKRotary rotary = [&](at::Tensor& q, at::Tensor& k) {
    // (B, H, L, Dh) views of (B, L, H, Dh): rotate in the reference's layout.
    q = WanRope::apply(q.transpose(1, 2), cos, sin).transpose(1, 2);
    k = WanRope::apply(k.transpose(1, 2), cos, sin).transpose(1, 2);
  };
  at::Tensor n = (fp32_layer_norm(x, eps_) * (1 + m[1]) + m[0]).to(dtype);
  record(".norm1", n);
  const at::Tensor self_out = attn1->self_attention(n, {}, rotary, ulysses);
  record(".attn1", self_out);
  at::Tensor h = (x.to(at::kFloat) + self_out * m[2]).to(dtype);
  n = norm2 ? norm2->forward(h.to(at::kFloat)).to(dtype) : h;
  const at::Tensor cross_out = attn2->cross_attention(n, context);
  record(".attn2", cross_out);
  h = h + cross_out;
  n = (fp32_layer_norm(h, eps_) * (1 + m[4]) + m[3]).to(dtype);
  h = (h.to(at::kFloat) + ffn->forward(n).to(at::kFloat) * m[5]).to(dtype);
  return {h};
}

WanTransformer::WanTransformer(torch::nn::Module& host, const WanConfig& config, AttentionBackend backend,
                               const at::TensorOptions& options)
    : config_(config) {
  const int64_t dim = config_.inner_dim();
  patch_embedding = host.register_module(
      "patch_embedding", std::make_shared<PatchProjection>(config_.in_channels, dim, config_.patch_size, options));
  auto condition = host.register_module("condition_embedder", std::make_shared<Container>());
  time_embedder = condition->register_module(
      "time_embedder", std::make_shared<MLPEmbedding>(config_.freq_dim, dim, dim, Activation::SiLU, options));
  time_proj = condition->register_module("time_proj", std::make_shared<Linear>(dim, 6 * dim, true, options));
  text_embedder = condition->register_module(
      "text_embedder", std::make_shared<MLPEmbedding>(config_.text_dim, dim, dim, Activation::GeluTanh, options));
  auto list = host.register_module("blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < config_.num_layers; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<WanBlock>(config_, backend, options)));
  const int64_t patch = config_.patch_size[0] * config_.patch_size[1] * config_.patch_size[2];
  proj_out =
      host.register_module("proj_out", std::make_shared<Linear>(dim, config_.out_channels * patch, true, options));
  scale_shift_table = host.register_parameter("scale_shift_table", at::empty({1, 2, dim}, options));
}

void WanTransformer::check_inputs(const at::Tensor& hidden_states, const at::Tensor& timestep,
                                  const at::Tensor& encoder_hidden_states) const {
  require_input_shape("wan", hidden_states, "hidden_states", {-1, config_.in_channels, -1, -1, -1});
  const int64_t batch = hidden_states.size(0);
  require_input_shape("wan", encoder_hidden_states, "encoder_hidden_states", {batch, -1, config_.text_dim});
  const char* axes[] = {"frames", "height", "width"};
  int64_t tokens = 1;
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t n = hidden_states.size(2 + i), p = config_.patch_size[static_cast<size_t>(i)];
    if (n % p != 0) fail("wan: latent {} {} is not a multiple of patch_size {}", axes[i], n, p);
    tokens *= n / p;
  }
  if (timestep.dim() == 2)
    require_input_shape("wan", timestep, "timestep", {batch, tokens});
  else
    require_input_shape("wan", timestep, "timestep", {batch});
  const c10::ScalarType weights = patch_embedding->weight.scalar_type();
  if (hidden_states.scalar_type() != weights)
    fail("wan: input 'hidden_states' is {} but the patch embedding weights are {} (pass inputs in the forward dtype)",
         precision::dtype_name(hidden_states.scalar_type()), precision::dtype_name(weights));
}

at::Tensor WanTransformer::forward(const at::Tensor& hidden_states, const at::Tensor& timestep,
                                   const at::Tensor& encoder_hidden_states, const WanRope& rope,
                                   const ForwardContext& ctx, size_t first_unit, const std::string& prefix) const {
  check_inputs(hidden_states, timestep, encoder_hidden_states);
  const int64_t batch = hidden_states.size(0);
  const int64_t pt = config_.patch_size[0], ph = config_.patch_size[1], pw = config_.patch_size[2];
  const int64_t f = hidden_states.size(2) / pt, h = hidden_states.size(3) / ph, w = hidden_states.size(4) / pw;
  auto [cos, sin] = rope.tables(f, h, w, hidden_states.device());
  const bool per_token = timestep.dim() == 2;
  const Ulysses* sp = ctx.ulysses;
  at::Tensor t = timestep;

  at::Tensor x = patch_embedding->forward(hidden_states);
  ctx.record(prefix + "patch_embedding", "out0", x);
  x = x.flatten(2).transpose(1, 2).contiguous();
  if (sp) {
    // Everything per token follows the token split: the patches, the rope
    // tables and a per-token timestep.
    sp->check_heads(config_.num_attention_heads, "wan");
    sp->local_tokens(f * h * w, "wan's latent grid (frames x height x width patches)");
    x = sp->shard(x, 1);
    cos = sp->shard(cos, 1);
    sin = sp->shard(sin, 1);
    if (per_token) t = sp->shard(t, 1);
  }

  // Per-token timesteps (B, L) (Wan2.2 TI2V) are embedded flat, then regrouped.
  SinusoidOptions sinusoid;
  sinusoid.dim = config_.freq_dim;
  at::Tensor t_emb = timestep_sinusoid(per_token ? t.flatten() : t, sinusoid);
  if (per_token) t_emb = t_emb.unflatten(0, {batch, t.size(1)});
  // The time embedder runs in its own (kept fp32) dtype; temb then takes the
  // text dtype before time_proj, as diffusers' type_as does.
  const at::Tensor temb = time_embedder->forward(t_emb.to(time_embedder->linear_1->weight.scalar_type()))
                              .to(encoder_hidden_states.scalar_type());
  at::Tensor timestep_proj = time_proj->forward(at::silu(temb));
  const at::Tensor context = text_embedder->forward(encoder_hidden_states);
  ctx.record(prefix + "condition_embedder", "in0", timestep);
  ctx.record(prefix + "condition_embedder", "out0", temb);
  ctx.record(prefix + "condition_embedder", "out1", timestep_proj);
  ctx.record(prefix + "condition_embedder", "out2", context);
  timestep_proj = timestep_proj.unflatten(per_token ? 2 : 1, {6, -1});

  for (size_t i = 0; i < blocks.size(); ++i) {
    WanBlock* block = blocks[i].get();
    // Names are built only when a tap listens; the unit function may be
    // called again in backward, so it holds copies, not references.
    const std::string module = ctx.tap ? prefix + "blocks." + std::to_string(i) : std::string();
    Tap* tap = ctx.tap;
    x = ctx.run_unit(first_unit + i, {x, context, timestep_proj, cos, sin},
                     [block, tap, module, sp](const Tensors& in) { return block->forward(in, tap, module, sp); })
            .at(0);
    ctx.record(module, "out0", x);
  }

  // Output modulation: (shift, scale) = table [1, 2, D] + temb, in fp32.
  std::vector<at::Tensor> mod;
  if (per_token) {
    mod = (scale_shift_table.unsqueeze(0) + temb.unsqueeze(2)).chunk(2, 2);
    for (at::Tensor& t : mod) t = t.squeeze(2);
  } else {
    mod = (scale_shift_table + temb.unsqueeze(1)).chunk(2, 1);
  }
  x = (fp32_layer_norm(x, config_.eps) * (1 + mod[1]) + mod[0]).to(x.scalar_type());
  x = proj_out->forward(x);
  if (sp) x = sp->gather(x, 1);
  ctx.record(prefix + "proj_out", "out0", x);
  // (B, F', H', W', pt, ph, pw, C) -> (B, C, F'pt, H'ph, W'pw).
  return x.reshape({batch, f, h, w, pt, ph, pw, -1})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})
      .flatten(6, 7)
      .flatten(4, 5)
      .flatten(2, 3);
}

Wan::Wan(const WanConfig& config, const FamilyOptions& options)
    : config_(config), inputs_(options.inputs), rope_(config.attention_head_dim, config.rope_max_seq_len) {
  if (options.experts != 0) config_.experts = options.experts;
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  if (config_.experts == 1) {
    experts_.push_back(std::make_unique<WanTransformer>(*this, config_, backend, opts));
    return;
  }
  for (const char* name : {"transformer", "transformer_2"}) {
    hosts_.push_back(register_module(name, std::make_shared<Container>()));
    experts_.push_back(std::make_unique<WanTransformer>(*hosts_.back(), config_, backend, opts));
  }
}

std::string Wan::prefix(size_t expert) const {
  if (experts_.size() == 1) return "";
  return expert == 0 ? "transformer." : "transformer_2.";
}

size_t Wan::expert_for(double timestep) const {
  // The Wan2.2 pipeline's switch: t >= boundary_ratio * num_train_timesteps.
  return experts_.size() == 1 || timestep >= config_.boundary_ratio * 1000.0 ? 0 : 1;
}

size_t Wan::route(const at::Tensor& timestep) const {
  if (experts_.size() == 1) return 0;
  const at::Tensor t = timestep.detach().to(at::kCPU, at::kDouble).flatten();
  const size_t expert = expert_for(t[0].item<double>());
  for (int64_t i = 1; i < t.size(0); ++i)
    if (expert_for(t[i].item<double>()) != expert)
      fail(
          "wan: one forward runs one expert, but its timesteps {} and {} fall on both sides of the expert "
          "boundary t = {} (batch only pairs of one step together, e.g. train.micro_batch = 1)",
          t[0].item<double>(), t[i].item<double>(), config_.boundary_ratio * 1000.0);
  return expert;
}

at::Tensor Wan::noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& /*sigmas*/,
                           const Cond& cond, const ForwardContext& ctx) {
  // Wan embeds the trajectory timesteps t in [0, 1000]; the sigma array is
  // never read. The expert is picked from the host copy where the caller has one.
  const size_t e = route(ctx.host_timesteps.defined() ? ctx.host_timesteps : timesteps);
  return experts_[e]->forward(inputs_.cast_latents(latents), inputs_.cast_timestep(timesteps),
                              inputs_.cast_cond(cond.at("encoder_hidden_states")), rope_, ctx,
                              e * static_cast<size_t>(config_.num_layers), prefix(e));
}

std::map<std::string, at::Tensor> Wan::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                         const std::string& extra_json, const ForwardContext& ctx) {
  const std::set<std::string> expected = {"hidden_states", "timestep", "encoder_hidden_states"};
  for (const auto& [name, tensor] : inputs)
    if (!expected.count(name))
      fail("wan: unexpected input '{}' (the forward takes {})", name, fmt::join(expected, ", "));
  for (const std::string& name : expected)
    if (!inputs.count(name)) fail("wan: missing input '{}' (the forward takes {})", name, fmt::join(expected, ", "));
  json::error_code ec;
  const json::value extra = json::parse(extra_json.empty() ? "{}" : extra_json, ec);
  if (ec || !extra.is_object()) fail("wan: extra arguments must be a JSON object, got '{}'", extra_json);
  for (const auto& [key, value] : extra.get_object()) {
    const std::string k(key);
    if (k.size() < 5 || k.compare(k.size() - 5, 5, "_note") != 0)
      fail("wan: unknown extra argument '{}' (the forward takes only tensors)", k);
  }
  const size_t e = route(inputs.at("timestep"));
  return {{"output",
           experts_[e]->forward(inputs.at("hidden_states"), inputs.at("timestep"), inputs.at("encoder_hidden_states"),
                                rope_, ctx, e * static_cast<size_t>(config_.num_layers), prefix(e))}};
}

std::vector<WrapUnit> Wan::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t e = 0; e < experts_.size(); ++e)
    for (size_t i = 0; i < experts_[e]->blocks.size(); ++i)
      units.push_back({prefix(e) + "blocks." + std::to_string(i), experts_[e]->blocks[i]});
  return units;
}

std::vector<std::string> Wan::default_lora_targets() const {
  // flow_grpo train_wan2_1.py and miles' default (docs/families.md §2.8): the
  // self- and cross-attention projections of every block (of both experts).
  return {"to_q", "to_k", "to_v", "to_out.0"};
}

std::vector<DtypeOverride> Wan::default_overrides() const {
  // diffusers' _keep_in_fp32_modules as from_pretrained(torch_dtype=bf16)
  // applies them (the bf16 reference fixture's weights_dtype_map): the time
  // embedder, every scale_shift_table and the cross-attention norm2. miles'
  // FSDP plan keeps only norm2; override the others with [[precision.override]]
  // (or family_overrides = false) to match it.
  return {{"*time_embedder.*", at::kFloat}, {"*scale_shift_table", at::kFloat}, {"*.norm2.*", at::kFloat}};
}

double Wan::guidance_scale(const GuidanceOptions& g, double timestep) const {
  if (experts_.size() == 1) {
    if (g.scale_2)
      fail(
          "wan: guidance_scale_2 is the scale of Wan2.2's low-noise expert, but this model has one expert "
          "(preset wan2.2-t2v-a14b, or model.weights_2, makes two)");
    return g.scale;
  }
  if (expert_for(timestep) == 0) return g.scale;
  if (!g.scale_2)
    fail("wan: the low-noise expert (t = {} < {}) needs rollout.guidance_scale_2 (Wan2.2 has no fallback)", timestep,
         config_.boundary_ratio * 1000.0);
  return *g.scale_2;
}

std::vector<int64_t> Wan::latent_shape(int64_t batch, const LatentGrid& grid) const {
  if (config_.in_channels != config_.out_channels)
    fail("wan: sampling needs a velocity shaped like the latent, but in_channels {} != out_channels {}",
         config_.in_channels, config_.out_channels);
  const std::vector<int64_t> sizes = {grid.frames, grid.height, grid.width};
  const char* axes[] = {"frames", "height", "width"};
  for (size_t i = 0; i < 3; ++i)
    if (sizes[i] % config_.patch_size[i] != 0)
      fail("wan: latent {} {} is not a multiple of patch_size {}", axes[i], sizes[i], config_.patch_size[i]);
  return {batch, config_.in_channels, grid.frames, grid.height, grid.width};
}

void Wan::check_sequence_parallel(int64_t ranks, const LatentGrid& grid) const {
  if (config_.num_attention_heads % ranks != 0)
    fail("parallel.sequence_parallel = {} does not divide wan's {} attention heads: expected a divisor of the heads",
         ranks, config_.num_attention_heads);
  latent_shape(1, grid);
  const int64_t tokens = grid.frames / config_.patch_size[0] * (grid.height / config_.patch_size[1]) *
                         (grid.width / config_.patch_size[2]);
  if (tokens % ranks != 0)
    fail(
        "parallel.sequence_parallel = {} does not divide wan's {} tokens per sample (rollout.frames x height x width "
        "in patches): expected a divisor of the token count",
        ranks, tokens);
}

LatentRgbFactors Wan::latent_rgb_factors() const {
  // Wan2.1's VAE has 16 channels (8x spatial), Wan2.2 TI2V-5B's 48 (16x).
  if (config_.out_channels == 16) {
    LatentRgbFactors f = wan21_vae_factors();
    f.temporal = 4;  // the VAE's 4x temporal compression
    return f;
  }
  if (config_.out_channels == 48)
    return {{{0.0119f, 0.0103f, 0.0046f},    {-0.1062f, -0.0504f, 0.0165f},  {0.014f, 0.0409f, 0.0491f},
             {-0.0813f, -0.0677f, 0.0607f},  {0.0656f, 0.0851f, 0.0808f},    {0.0264f, 0.0463f, 0.0912f},
             {0.0295f, 0.0326f, 0.059f},     {-0.0244f, -0.027f, 0.0025f},   {0.0443f, -0.0102f, 0.0288f},
             {-0.0465f, -0.009f, -0.0205f},  {0.0359f, 0.0236f, 0.0082f},    {-0.0776f, 0.0854f, 0.1048f},
             {0.0564f, 0.0264f, 0.0561f},    {0.0006f, 0.0594f, 0.0418f},    {-0.0319f, -0.0542f, -0.0637f},
             {-0.0268f, 0.0024f, 0.026f},    {0.0539f, 0.0265f, 0.0358f},    {-0.0359f, -0.0312f, -0.0287f},
             {-0.0285f, -0.1032f, -0.1237f}, {0.1041f, 0.0537f, 0.0622f},    {-0.0086f, -0.0374f, -0.0051f},
             {0.039f, 0.067f, 0.2863f},      {0.0069f, 0.0144f, 0.0082f},    {0.0006f, -0.0167f, 0.0079f},
             {0.0313f, -0.0574f, -0.0232f},  {-0.1454f, -0.0902f, -0.0481f}, {0.0714f, 0.0827f, 0.0447f},
             {-0.0304f, -0.0574f, -0.0196f}, {0.0401f, 0.0384f, 0.0204f},    {-0.0758f, -0.0297f, -0.0014f},
             {0.0568f, 0.1307f, 0.1372f},    {-0.0055f, -0.031f, -0.038f},   {0.0239f, -0.0305f, 0.0325f},
             {-0.0663f, -0.0673f, -0.014f},  {-0.0416f, -0.0047f, -0.0023f}, {0.0166f, 0.0112f, -0.0093f},
             {-0.0211f, 0.0011f, 0.0331f},   {0.1833f, 0.1466f, 0.225f},     {-0.0368f, 0.037f, 0.0295f},
             {-0.3441f, -0.3543f, -0.2008f}, {-0.0479f, -0.0489f, -0.042f},  {-0.066f, -0.0153f, 0.08f},
             {-0.0101f, 0.0068f, 0.0156f},   {-0.069f, -0.0452f, -0.0927f},  {-0.0145f, 0.0041f, 0.0015f},
             {0.0421f, 0.0451f, 0.0373f},    {0.0504f, -0.0483f, -0.0356f},  {-0.0837f, 0.0168f, 0.0055f}},
            {0.0317f, -0.0878f, -0.1388f},
            16,
            4,
            "ComfyUI's Wan2.2 latent preview factors"};
  return {};
}

at::Tensor Wan::latent_frames(const at::Tensor& latents, const LatentGrid& /*grid*/) const {
  if (latents.dim() != 5) fail("wan: expected video latents [B, C, F, H, W], got {}", c10::str(latents.sizes()));
  return latents.permute({0, 2, 1, 3, 4});
}

std::vector<CondSpec> Wan::cond_spec() const {
  // UMT5 states zero-padded to the fixed text length; Wan takes no mask.
  return {{"encoder_hidden_states", {config_.text_tokens, config_.text_dim}, c10::ScalarType::Float}};
}

std::vector<std::shared_ptr<torch::nn::Module>> Wan::expert_modules() {
  return hosts_;
}

std::string WanConfig::to_json() const {
  json::object o = json_config::diffusers_header("WanTransformer3DModel");
  json_config::write_config(*this, o);
  return json::serialize(o);
}

}  // namespace ditrl::models
