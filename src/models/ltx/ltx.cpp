#include <ditrl/error.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/norms.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <algorithm>
#include <limits>
#include <set>

namespace ditrl::models {

namespace json = boost::json;

namespace {

constexpr double kNormOutEps = 1e-6;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string shape_of(const at::Tensor& t) {
  return c10::str(t.sizes());
}

// ltx_core _prepare_attention_mask: an integer 0/1 (B, L) mask becomes the
// additive (mask - 1) * finfo(dtype).max of shape (B, 1, 1, L); a floating mask
// is already additive and passes unchanged.
at::Tensor context_bias(const at::Tensor& mask, c10::ScalarType dtype, const std::string& name) {
  if (!mask.defined() || mask.is_floating_point()) return mask;
  if (mask.scalar_type() == at::kBool)
    fail("ltx: '{}' is a bool mask; pass an integer 0/1 mask or an additive float mask (ltx_core computes mask - 1)",
         name);
  const double max = dtype == at::kBFloat16 ? static_cast<double>(std::numeric_limits<c10::BFloat16>::max())
                     : dtype == at::kHalf   ? static_cast<double>(std::numeric_limits<c10::Half>::max())
                     : dtype == at::kDouble ? std::numeric_limits<double>::max()
                                            : static_cast<double>(std::numeric_limits<float>::max());
  return (mask - 1).to(dtype).reshape({mask.size(0), 1, -1, mask.size(-1)}) * max;
}

// ltx_core _prepare_self_attention_mask: weights in [0, 1] -> additive
// log(max(m, tiny)) where m > 0 and finfo(dtype).min elsewhere, (B, 1, T, T).
at::Tensor self_attention_bias(const at::Tensor& weights, c10::ScalarType dtype) {
  if (!weights.defined()) return weights;
  const bool bf16 = dtype == at::kBFloat16, half = dtype == at::kHalf, dbl = dtype == at::kDouble;
  const double lowest = bf16   ? static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest())
                        : half ? static_cast<double>(std::numeric_limits<c10::Half>::lowest())
                        : dbl  ? std::numeric_limits<double>::lowest()
                               : static_cast<double>(std::numeric_limits<float>::lowest());
  const double tiny = bf16   ? static_cast<double>(std::numeric_limits<c10::BFloat16>::min())
                      : half ? static_cast<double>(std::numeric_limits<c10::Half>::min())
                      : dbl  ? std::numeric_limits<double>::min()
                             : static_cast<double>(std::numeric_limits<float>::min());
  at::Tensor bias = at::full_like(weights, lowest, weights.options().dtype(dtype));
  const at::Tensor positive = weights > 0;
  bias.index_put_({positive}, at::log(weights.index({positive}).clamp_min(tiny)).to(dtype));
  return bias.unsqueeze(1);
}

// An additive bias of zeros masks nothing: it is dropped, since a mask given
// to attention changes the kernel (flash only runs unmasked), and attention
// is passed a mask only when it masks something.
bool masks_nothing(const at::Tensor& bias) {
  return bias.defined() && bias.eq(0).all().item<bool>();
}

at::Tensor unless_masks_nothing(const at::Tensor& bias) {
  return masks_nothing(bias) ? at::Tensor() : bias;
}

// The context mask's bias unless it masks nothing, decided from the mask's
// host copy where the caller has one, so the forward does not read the device.
at::Tensor context_mask_bias(const LtxModality& m, c10::ScalarType dtype, const std::string& name) {
  const at::Tensor bias = context_bias(m.context_mask, dtype, name);
  if (!m.context_mask_on_host.defined()) return unless_masks_nothing(bias);
  return masks_nothing(context_bias(m.context_mask_on_host, dtype, name)) ? at::Tensor() : bias;
}

void require(bool ok, const std::string& name, const at::Tensor& t, const std::string& expected) {
  if (!ok) fail("ltx: input '{}' has shape {}, expected {}", name, shape_of(t), expected);
}

}  // namespace

// The modules of one stream by role, so both streams share one code path.
struct LTX::StreamModules {
  std::string prefix;  // "" (video) or "audio_" in module and input names
  std::string input;   // "video" | "audio"
  Linear* patchify_proj;
  LtxAdaLN* adaln;
  LtxAdaLN* prompt_adaln;
  MLPEmbedding* caption_projection;
  const at::Tensor* table;
  Linear* proj_out;
  LtxAdaLN* cross_scale_shift;  // av_ca_{video|audio}_scale_shift_adaln_single
  LtxAdaLN* cross_gate;         // av_ca_{a2v|v2a}_gate_adaln_single
  std::string cross_scale_shift_name, cross_gate_name;
  int64_t heads, dim, in_channels, context_dim;
  std::vector<int64_t> max_pos;
};

LtxAdaLN::LtxAdaLN(int64_t dim, int64_t rows, const at::TensorOptions& options) {
  auto emb = register_module("emb", std::make_shared<Container>());
  timestep_embedder = emb->register_module("timestep_embedder",
                                           std::make_shared<MLPEmbedding>(256, dim, dim, Activation::SiLU, options));
  linear = register_module("linear", std::make_shared<Linear>(dim, rows * dim, true, options));
}

std::pair<at::Tensor, at::Tensor> LtxAdaLN::forward(const at::Tensor& scaled_timesteps, c10::ScalarType hidden) const {
  const at::Tensor embedded =
      timestep_embedder->forward(timestep_sinusoid(scaled_timesteps.flatten(), SinusoidOptions{}).to(hidden));
  return {linear->forward(at::silu(embedded)), embedded};
}

LTX::LTX(const LtxConfig& config, const FamilyOptions& options)
    : config_(config), inputs_(options.inputs), grid_(options.latent_grid) {
  config_.validate();
  const AttentionBackend backend = usable_attention_backend(options.attention);
  const at::TensorOptions opts = options.parameter_options();
  const LtxConfig& c = config_;
  const int64_t dim = c.inner_dim();
  patchify_proj = register_module("patchify_proj", std::make_shared<Linear>(c.in_channels, dim, true, opts));
  adaln_single = register_module("adaln_single", std::make_shared<LtxAdaLN>(dim, c.adaln_rows(), opts));
  if (c.prompt_adaln())
    prompt_adaln_single = register_module("prompt_adaln_single", std::make_shared<LtxAdaLN>(dim, 2, opts));
  if (c.caption_projection)
    caption_projection = register_module(
        "caption_projection", std::make_shared<MLPEmbedding>(c.caption_channels, dim, dim, Activation::GeluTanh, opts));
  scale_shift_table = register_parameter("scale_shift_table", at::empty({2, dim}, opts));
  proj_out = register_module("proj_out", std::make_shared<Linear>(dim, c.out_channels, true, opts));
  if (c.audio) {
    const int64_t adim = c.audio_inner_dim();
    audio_patchify_proj =
        register_module("audio_patchify_proj", std::make_shared<Linear>(c.audio_in_channels, adim, true, opts));
    audio_adaln_single = register_module("audio_adaln_single", std::make_shared<LtxAdaLN>(adim, c.adaln_rows(), opts));
    if (c.prompt_adaln())
      audio_prompt_adaln_single =
          register_module("audio_prompt_adaln_single", std::make_shared<LtxAdaLN>(adim, 2, opts));
    if (c.caption_projection)
      audio_caption_projection =
          register_module("audio_caption_projection",
                          std::make_shared<MLPEmbedding>(c.caption_channels, adim, adim, Activation::GeluTanh, opts));
    audio_scale_shift_table = register_parameter("audio_scale_shift_table", at::empty({2, adim}, opts));
    audio_proj_out =
        register_module("audio_proj_out", std::make_shared<Linear>(adim, c.audio_out_channels, true, opts));
    av_ca_video_scale_shift_adaln_single =
        register_module("av_ca_video_scale_shift_adaln_single", std::make_shared<LtxAdaLN>(dim, 4, opts));
    av_ca_audio_scale_shift_adaln_single =
        register_module("av_ca_audio_scale_shift_adaln_single", std::make_shared<LtxAdaLN>(adim, 4, opts));
    av_ca_a2v_gate_adaln_single =
        register_module("av_ca_a2v_gate_adaln_single", std::make_shared<LtxAdaLN>(dim, 1, opts));
    av_ca_v2a_gate_adaln_single =
        register_module("av_ca_v2a_gate_adaln_single", std::make_shared<LtxAdaLN>(adim, 1, opts));
  }
  auto list = register_module("transformer_blocks", std::make_shared<Container>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks.push_back(list->register_module(std::to_string(i), std::make_shared<LtxBlock>(c, backend, opts)));
  // The trained path is the video stream (as ltx-trainer and miles train
  // LTX-2.3): the audio stream and the A/V attention are loaded but frozen.
  for (auto& p : named_parameters())
    if (is_audio_parameter(p.key())) p.value().set_requires_grad(false);
}

bool LTX::is_audio_parameter(const std::string& name) {
  std::string local = name;
  const std::string blocks_prefix = "transformer_blocks.";
  if (starts_with(name, blocks_prefix)) local = name.substr(name.find('.', blocks_prefix.size()) + 1);
  for (const char* audio : {"audio_", "av_ca_", "video_to_audio_attn.", "scale_shift_table_a2v_ca_"})
    if (starts_with(local, audio)) return true;
  return false;
}

LTX::StreamModules LTX::stream_modules(bool audio) const {
  const LtxConfig& c = config_;
  if (!audio)
    return {"",
            "video",
            patchify_proj.get(),
            adaln_single.get(),
            prompt_adaln_single.get(),
            caption_projection.get(),
            &scale_shift_table,
            proj_out.get(),
            av_ca_video_scale_shift_adaln_single.get(),
            av_ca_a2v_gate_adaln_single.get(),
            "av_ca_video_scale_shift_adaln_single",
            "av_ca_a2v_gate_adaln_single",
            c.num_attention_heads,
            c.inner_dim(),
            c.in_channels,
            c.context_in_dim(),
            c.positional_embedding_max_pos};
  return {"audio_",
          "audio",
          audio_patchify_proj.get(),
          audio_adaln_single.get(),
          audio_prompt_adaln_single.get(),
          audio_caption_projection.get(),
          &audio_scale_shift_table,
          audio_proj_out.get(),
          av_ca_audio_scale_shift_adaln_single.get(),
          av_ca_v2a_gate_adaln_single.get(),
          "av_ca_audio_scale_shift_adaln_single",
          "av_ca_v2a_gate_adaln_single",
          c.audio_num_attention_heads,
          c.audio_inner_dim(),
          c.audio_in_channels,
          c.audio_context_in_dim(),
          c.audio_positional_embedding_max_pos};
}

void LTX::check_modality(const LtxModality& m, const StreamModules& s) const {
  const std::string n = s.input + ".";
  for (const auto& [name, t] : std::vector<std::pair<const char*, const at::Tensor*>>{{"latent", &m.latent},
                                                                                      {"sigma", &m.sigma},
                                                                                      {"timesteps", &m.timesteps},
                                                                                      {"positions", &m.positions},
                                                                                      {"context", &m.context}})
    if (!t->defined()) fail("ltx: input '{}{}' is missing", n, name);
  require(m.latent.dim() == 3 && m.latent.size(2) == s.in_channels, n + "latent", m.latent,
          fmt::format("(B, T, {})", s.in_channels));
  const int64_t b = m.latent.size(0), t = m.latent.size(1);
  require(m.sigma.dim() == 1 && m.sigma.size(0) == b, n + "sigma", m.sigma, fmt::format("({})", b));
  require(m.timesteps.numel() == b || m.timesteps.numel() == b * t, n + "timesteps", m.timesteps,
          fmt::format("{} or {} values (one per sample or per token)", b, b * t));
  const int64_t axes = static_cast<int64_t>(s.max_pos.size());
  require(m.positions.dim() == 4 && m.positions.size(0) == b && m.positions.size(1) == axes &&
              m.positions.size(2) == t && m.positions.size(3) == 2,
          n + "positions", m.positions, fmt::format("({}, {}, {}, 2)", b, axes, t));
  require(m.context.dim() == 3 && m.context.size(0) == b && m.context.size(2) == s.context_dim, n + "context",
          m.context, fmt::format("({}, L, {})", b, s.context_dim));
  if (m.context_mask.defined() && !m.context_mask.is_floating_point())
    require(m.context_mask.dim() == 2 && m.context_mask.size(0) == b && m.context_mask.size(1) == m.context.size(1),
            n + "context_mask", m.context_mask, fmt::format("({}, {})", b, m.context.size(1)));
  if (m.attention_mask.defined())
    require(m.attention_mask.dim() == 3 && m.attention_mask.size(0) == b && m.attention_mask.size(1) == t &&
                m.attention_mask.size(2) == t,
            n + "attention_mask", m.attention_mask, fmt::format("({}, {}, {})", b, t, t));
  const c10::ScalarType weights = s.patchify_proj->weight.scalar_type();
  if (m.latent.scalar_type() != weights)
    fail("ltx: input '{}latent' is {} but the weights are {} (pass inputs in the forward dtype)", n,
         precision::dtype_name(m.latent.scalar_type()), precision::dtype_name(weights));
}

LtxStream LTX::prepare(const LtxModality& m, const StreamModules& s, at::Tensor& embedded,
                       const ForwardContext& ctx) const {
  const c10::ScalarType dtype = m.latent.scalar_type();
  const int64_t b = m.latent.size(0);
  const double scale = config_.timestep_scale_multiplier;
  LtxStream out;
  out.x = s.patchify_proj->forward(m.latent);
  ctx.record(s.prefix + "patchify_proj", "out0", out.x);
  // The AdaLNs' inputs (sigma x 1000 as they consume it) are parity dump points.
  const at::Tensor scaled_timesteps = (m.timesteps * scale).flatten();
  ctx.record(s.prefix + "adaln_single", "in0", scaled_timesteps);
  auto [timestep, emb] = s.adaln->forward(scaled_timesteps, dtype);
  ctx.record(s.prefix + "adaln_single", "out0", timestep);
  ctx.record(s.prefix + "adaln_single", "out1", emb);
  out.timestep = timestep.view({b, -1, timestep.size(-1)});
  embedded = emb.view({b, -1, emb.size(-1)});
  if (s.prompt_adaln) {
    const at::Tensor scaled_sigma = m.sigma * scale;
    ctx.record(s.prefix + "prompt_adaln_single", "in0", scaled_sigma);
    auto [prompt, prompt_emb] = s.prompt_adaln->forward(scaled_sigma, dtype);
    ctx.record(s.prefix + "prompt_adaln_single", "out0", prompt);
    ctx.record(s.prefix + "prompt_adaln_single", "out1", prompt_emb);
    out.prompt_timestep = prompt.view({b, -1, prompt.size(-1)});
  }
  at::Tensor context = m.context;
  if (s.caption_projection) {
    context = s.caption_projection->forward(context);
    ctx.record(s.prefix + "caption_projection", "out0", context);
  }
  out.context = context.view({b, -1, out.x.size(-1)});
  out.context_mask = context_mask_bias(m, dtype, s.input + ".context_mask");
  RopeOptions rope;
  rope.inner_dim = s.dim;
  rope.heads = s.heads;
  rope.max_pos = s.max_pos;
  rope.theta = config_.positional_embedding_theta;
  rope.double_precision = config_.double_precision_rope;
  rope.middle = config_.use_middle_indices_grid;
  out.pe = ltx_rope_tables(m.positions, rope, dtype);
  out.self_mask = unless_masks_nothing(self_attention_bias(m.attention_mask, dtype));
  return out;
}

void LTX::prepare_cross(LtxStream& stream, const LtxModality& m, const LtxModality& other, const StreamModules& s,
                        const ForwardContext& ctx) const {
  const LtxConfig& c = config_;
  const c10::ScalarType dtype = m.latent.scalar_type();
  const int64_t b = m.latent.size(0);
  RopeOptions rope;
  rope.inner_dim = c.audio_cross_attention_dim;
  rope.heads = s.heads;
  rope.max_pos = {std::max(c.positional_embedding_max_pos[0], c.audio_positional_embedding_max_pos[0])};
  rope.theta = c.positional_embedding_theta;
  rope.double_precision = c.double_precision_rope;
  rope.middle = true;
  stream.cross_pe = ltx_rope_tables(m.positions.slice(1, 0, 1), rope, dtype);
  const double scale = c.timestep_scale_multiplier;
  const at::Tensor scaled_timesteps = (m.timesteps * scale).flatten();
  ctx.record(s.cross_scale_shift_name, "in0", scaled_timesteps);
  auto [scale_shift, ss_emb] = s.cross_scale_shift->forward(scaled_timesteps, dtype);
  ctx.record(s.cross_scale_shift_name, "out0", scale_shift);
  ctx.record(s.cross_scale_shift_name, "out1", ss_emb);
  stream.cross_scale_shift = scale_shift.view({b, -1, scale_shift.size(-1)});
  // The gate of this stream's cross attention follows the other stream's sigma.
  const at::Tensor scaled_other = other.sigma * scale * (c.av_ca_timestep_scale_multiplier / scale);
  ctx.record(s.cross_gate_name, "in0", scaled_other);
  auto [gate, gate_emb] = s.cross_gate->forward(scaled_other, dtype);
  ctx.record(s.cross_gate_name, "out0", gate);
  ctx.record(s.cross_gate_name, "out1", gate_emb);
  stream.cross_gate = gate.view({b, -1, gate.size(-1)});
}

// ltx_core _process_output: (shift, scale) = table + embedded timestep, the
// LayerNorm without affine, the modulation, proj_out.
at::Tensor LTX::output(const at::Tensor& x, const at::Tensor& embedded, const StreamModules& s,
                       const ForwardContext& ctx) const {
  const std::vector<at::Tensor> sst =
      (s.table->unsqueeze(0).unsqueeze(0).to(x.scalar_type()) + embedded.unsqueeze(2)).unbind(2);
  const at::Tensor& shift = sst[0];
  const at::Tensor& scale = sst[1];
  // fp32 tail: LayerNorm of fp32 x, the modulation promoted to fp32 ((1 +
  // scale) is still formed in the forward dtype, as under autocast), one
  // rounding before proj_out. Else ltx_core's eager ops in the forward dtype.
  const at::Tensor tail = config_.fp32_output_tail && x.scalar_type() != at::kFloat
                              ? (layer_norm(x.to(at::kFloat), kNormOutEps) * (1 + scale) + shift).to(x.scalar_type())
                              : layer_norm(x, kNormOutEps) * (1 + scale) + shift;
  const at::Tensor out = s.proj_out->forward(tail);
  ctx.record(s.prefix + "proj_out", "out0", out);
  return out;
}

namespace {

// What follows the token split of a stream: its tokens, a per-token AdaLN
// (and the output layer's embedding), the RoPE tables and a text mask with a
// query dimension. The text and the self-attention mask (over the whole
// sequence, applied after the all-to-all) stay whole.
void shard_tokens(LtxStream& s, at::Tensor& embedded, const Ulysses& sp) {
  const int64_t tokens = s.x.size(1);
  sp.local_tokens(tokens, "ltx's video (frames x height x width latent tokens)");
  s.x = sp.shard(s.x, 1);
  if (s.timestep.size(1) == tokens) s.timestep = sp.shard(s.timestep, 1);
  if (embedded.size(1) == tokens) embedded = sp.shard(embedded, 1);
  s.pe = {sp.shard(s.pe.cos, 2), sp.shard(s.pe.sin, 2)};
  if (s.context_mask.defined() && s.context_mask.dim() >= 2 && s.context_mask.size(-2) == tokens)
    s.context_mask = sp.shard(s.context_mask, s.context_mask.dim() - 2);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> LTX::forward(const LtxModality& video, const LtxModality* audio,
                                               const ForwardContext& ctx) {
  if (audio && !config_.audio)
    fail("ltx: audio inputs given but the model has no audio stream (a video-only preset/config)");
  const StreamModules vs = stream_modules(false);
  check_modality(video, vs);
  const StreamModules as = audio ? stream_modules(true) : StreamModules{};
  if (audio) {
    check_modality(*audio, as);
    if (audio->latent.size(0) != video.latent.size(0))
      fail("ltx: audio batch {} differs from the video batch {}", audio->latent.size(0), video.latent.size(0));
  }
  const Ulysses* sp = ctx.ulysses;
  if (sp && audio)
    fail("ltx: parallel.sequence_parallel splits the video stream only; the audio stream cannot run with it");
  at::Tensor v_embedded, a_embedded;
  LtxStream v = prepare(video, vs, v_embedded, ctx);
  if (sp) shard_tokens(v, v_embedded, *sp);
  LtxStream a;
  if (audio) {
    a = prepare(*audio, as, a_embedded, ctx);
    prepare_cross(v, video, *audio, vs, ctx);
    prepare_cross(a, *audio, video, as, ctx);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const LtxBlock* block = blocks[i].get();
    const bool with_audio = audio != nullptr;
    Tensors inputs;
    v.append_to(inputs);
    if (with_audio) a.append_to(inputs);
    // Names are built only when a tap listens; the unit function may be
    // called again in backward, so it holds copies, not references.
    const std::string module = ctx.tap ? "transformer_blocks." + std::to_string(i) : std::string();
    Tap* tap = ctx.tap;
    const Tensors out = ctx.run_unit(i, inputs, [block, with_audio, tap, module, sp](const Tensors& in) {
      const LtxStream vi = LtxStream::from(in, 0);
      if (!with_audio) return Tensors{block->forward(vi, nullptr, tap, module, sp).first};
      const LtxStream ai = LtxStream::from(in, LtxStream::kTensors);
      const auto [vx, ax] = block->forward(vi, &ai, tap, module);
      return Tensors{vx, ax};
    });
    v.x = out.at(0);
    ctx.record(module, "out0", v.x);
    if (with_audio) {
      a.x = out.at(1);
      ctx.record(module, "out1", a.x);
    }
  }
  at::Tensor vout = output(v.x, v_embedded, vs, ctx);
  if (sp) vout = sp->gather(vout, 1);
  at::Tensor aout = audio ? output(a.x, a_embedded, as, ctx) : at::Tensor();
  return {vout, aout};
}

// The velocity the rollout steps with and the trainer scores. ltx-pipelines
// denoise in x0 space (X0Model: x0 = to_denoised(x, v, sigma), fp32 math
// rounded to the latent dtype) and the trainer that matches them (miles)
// turns that x0 back into a velocity (docs/algorithms.md §9.4): both sides of a
// ditrl run go through this same round trip, and trajectories from such an
// engine carry velocities with exactly these roundings.
at::Tensor LTX::noise_pred(const at::Tensor& latents, const at::Tensor& /*timesteps*/, const at::Tensor& sigmas,
                           const Cond& cond, const ForwardContext& ctx) {
  if (latents.dim() != 3 || latents.size(2) != config_.in_channels)
    fail("ltx: latents have shape {}, expected (B, F*H*W, {}) tokens", shape_of(latents), config_.in_channels);
  const int64_t tokens = grid_.frames * grid_.height * grid_.width;
  if (latents.size(1) != tokens)
    fail("ltx: latents have {} tokens but the latent grid {}x{}x{} ([rollout] frames, height, width) has {}",
         latents.size(1), grid_.frames, grid_.height, grid_.width, tokens);
  const int64_t b = latents.size(0);
  if (sigmas.dim() != 1 || sigmas.size(0) != b) fail("ltx: sigmas have shape {}, expected ({})", shape_of(sigmas), b);
  LtxModality video;
  video.latent = inputs_.cast_latents(latents);
  // sigma in [0, 1] as the rollout recorded it; one AdaLN row per sample
  // (every token of a text-to-video sample is at the same noise level).
  video.sigma = inputs_.cast_timestep(sigmas);
  video.timesteps = video.sigma.view({b, 1});
  video.positions = ltx_video_positions(b, grid_.frames, grid_.height, grid_.width, grid_.fps, latents.device());
  video.context = inputs_.cast_cond(cond.at("video.context"));
  if (cond.has("video.context_mask")) {
    video.context_mask = inputs_.cast_cond(cond.at("video.context_mask"));
    video.context_mask_on_host = inputs_.cast_cond(cond.on_host("video.context_mask"));
  }
  const at::Tensor v = forward(video, nullptr, ctx).first;
  // to_denoised with sigma in the latent dtype, then (x - x0) / max(sigma, 1e-8), all in fp32.
  const at::Tensor x = video.latent.to(at::kFloat);
  const at::Tensor sigma = video.sigma.to(video.latent.scalar_type()).to(at::kFloat).view({b, 1, 1});
  const at::Tensor x0 = (x - v.to(at::kFloat) * sigma).to(video.latent.scalar_type());
  return ((x - x0.to(at::kFloat)) / sigma.clamp_min(1e-8)).to(v.scalar_type());
}

std::map<std::string, at::Tensor> LTX::reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                         const std::string& extra_json, const ForwardContext& ctx) {
  const std::set<std::string> fields = {"latent",  "sigma",        "timesteps",     "positions",
                                        "context", "context_mask", "attention_mask"};
  std::map<std::string, LtxModality> modalities;
  for (const auto& [name, tensor] : inputs) {
    const size_t dot = name.find('.');
    const std::string stream = name.substr(0, dot);
    const std::string field = dot == std::string::npos ? "" : name.substr(dot + 1);
    if ((stream != "video" && stream != "audio") || !fields.count(field))
      fail("ltx: unexpected input '{}' (the forward takes video.<field> and audio.<field> for fields {})", name,
           fmt::join(fields, ", "));
    LtxModality& m = modalities[stream];
    at::Tensor* slot = field == "latent"         ? &m.latent
                       : field == "sigma"        ? &m.sigma
                       : field == "timesteps"    ? &m.timesteps
                       : field == "positions"    ? &m.positions
                       : field == "context"      ? &m.context
                       : field == "context_mask" ? &m.context_mask
                                                 : &m.attention_mask;
    *slot = tensor;
  }
  if (!modalities.count("video")) fail("ltx: no video.* inputs (the video stream is required)");
  if (!extra_json.empty()) {
    // Non-tensor notes of a sidecar (fps, latent shape) are already in the positions.
    json::error_code ec;
    const json::value extra = json::parse(extra_json, ec);
    if (ec || !extra.is_object()) fail("ltx: extra arguments must be a JSON object, got '{}'", extra_json);
  }
  const auto audio = modalities.find("audio");
  const auto [video_out, audio_out] =
      forward(modalities.at("video"), audio == modalities.end() ? nullptr : &audio->second, ctx);
  std::map<std::string, at::Tensor> out{{"output.video", video_out}};
  if (audio_out.defined()) out["output.audio"] = audio_out;
  return out;
}

std::vector<WrapUnit> LTX::wrap_units() {
  std::vector<WrapUnit> units;
  for (size_t i = 0; i < blocks.size(); ++i) units.push_back({"transformer_blocks." + std::to_string(i), blocks[i]});
  return units;
}

std::vector<std::string> LTX::default_lora_targets() const {
  // docs/families.md §3.7's projections, limited to the video stream the trainer
  // runs: the bare suffixes ("to_q", "net.2") would also adapt the audio and
  // A/V attentions, whose adapters never get a gradient on the video path.
  return {"attn1.to_q", "attn1.to_k", "attn1.to_v",     "attn1.to_out.0", "attn2.to_q",
          "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj",  "ff.net.2"};
}

std::vector<int64_t> LTX::latent_shape(int64_t batch, const LatentGrid& grid) const {
  return {batch, grid.frames * grid.height * grid.width, config_.in_channels};
}

void LTX::check_sequence_parallel(int64_t ranks, const LatentGrid& grid) const {
  if (config_.num_attention_heads % ranks != 0)
    fail("parallel.sequence_parallel = {} does not divide ltx's {} attention heads: expected a divisor of the heads",
         ranks, config_.num_attention_heads);
  const int64_t tokens = grid.frames * grid.height * grid.width;
  if (tokens % ranks != 0)
    fail(
        "parallel.sequence_parallel = {} does not divide ltx's {} tokens per sample (rollout.frames x height x width): "
        "expected a divisor of the token count",
        ranks, tokens);
}

LatentRgbFactors LTX::latent_rgb_factors() const {
  if (config_.out_channels != 128) return {};
  // The only published factors for a 128-channel LTX VAE are LTX-Video 0.9's
  // (ComfyUI's latent_formats.LTXV); LTX-2's VAE differs, so its preview's
  // colours are rough.
  return {{{0.011202f, -0.00063815f, -0.010021f},    {0.086031f, 0.065813f, 0.00095409f},
           {-0.012576f, -0.0075734f, -0.0040528f},   {0.0094063f, -0.0021688f, 0.0026093f},
           {0.0037636f, 0.012765f, 0.0091548f},      {0.021024f, -0.0052973f, 0.0034373f},
           {-0.0088896f, -0.019703f, -0.018761f},    {-0.01316f, -0.010523f, 0.0019709f},
           {-0.0015152f, -0.0069891f, -0.007581f},   {-0.0017247f, 0.0004656f, -0.0033839f},
           {0.013617f, 0.0047077f, -0.0020045f},     {0.010256f, 0.0077318f, 0.013948f},
           {-0.016108f, -0.0062151f, 0.0011561f},    {0.0073407f, 0.015628f, 0.00044865f},
           {0.00095357f, -0.0029518f, -0.01476f},    {0.019143f, 0.010868f, 0.012264f},
           {0.0044575f, 3.6682e-05f, -0.0068508f},   {-0.00045681f, 0.003257f, 0.0077929f},
           {0.033902f, 0.033405f, 0.037454f},        {-0.023001f, -0.0024877f, -0.0031033f},
           {0.050265f, 0.038841f, 0.033539f},        {-0.0041018f, -0.0011095f, 0.0015859f},
           {-0.12689f, -0.13107f, -0.21005f},        {0.026276f, 0.014189f, -0.0035963f},
           {-0.0048679f, 0.0088486f, 0.0078029f},    {-0.001661f, -0.0048597f, -0.005206f},
           {-0.002101f, 0.002361f, 0.0093796f},      {-0.022482f, -0.021305f, -0.015087f},
           {-0.015753f, -0.010646f, -0.0065083f},    {-0.0046975f, 0.0050288f, -0.006739f},
           {0.011951f, 0.020712f, 0.016191f},        {-0.0063704f, -0.0084827f, -0.0095483f},
           {0.007261f, -0.0099326f, -0.022978f},     {-0.00091904f, 0.0062882f, 0.009572f},
           {-0.037178f, -0.037123f, -0.056713f},     {-0.13373f, -0.1072f, -0.053801f},
           {-0.0053702f, 0.0081256f, 0.0088397f},    {-0.15247f, -0.21437f, -0.21843f},
           {0.031441f, 0.0070335f, -0.0097541f},     {0.0021528f, -0.0089817f, -0.021023f},
           {0.0038461f, -0.0058957f, -0.015014f},    {-0.004347f, -0.01294f, -0.015972f},
           {-0.0054781f, -0.010842f, -0.0030204f},   {-0.0065347f, 0.0030806f, -0.010163f},
           {-0.0050414f, -0.0071503f, -0.00089686f}, {-0.0085851f, -0.0024351f, 0.0010674f},
           {-0.0090016f, -0.0096493f, 0.0015692f},   {0.0050914f, 0.012099f, 0.019968f},
           {0.013758f, 0.011669f, 0.0081958f},       {-0.010518f, -0.011575f, -0.0041307f},
           {-0.02841f, -0.031266f, -0.022149f},      {0.0029336f, 0.036511f, 0.018717f},
           {-0.016703f, -0.016696f, -0.0044529f},    {0.048818f, 0.040063f, 0.008741f},
           {-0.015066f, -0.00057328f, 0.0029785f},   {-0.017613f, -0.0081034f, 0.013086f},
           {-0.0092633f, 0.010803f, -0.0063489f},    {0.0030851f, 0.0004775f, 0.012347f},
           {-0.022785f, -0.023043f, -0.026005f},     {-0.024787f, -0.015389f, -0.022104f},
           {-0.023572f, 0.0010544f, 0.012361f},      {-0.0078915f, -0.0012271f, -0.0060968f},
           {-0.011478f, -0.0012543f, 0.0062679f},    {-0.054229f, 0.026644f, 0.0063394f},
           {0.0044216f, -0.0073338f, -0.010464f},    {-0.0045013f, 0.0016082f, 0.01442f},
           {0.013673f, 0.0088877f, 0.0041253f},      {-0.010145f, 0.0090072f, 0.015695f},
           {-0.0056234f, 0.0011847f, 0.0081261f},    {-0.0037171f, -0.0053538f, 0.001259f},
           {0.029476f, 0.021424f, 0.030424f},        {-0.034925f, -0.02434f, -0.025316f},
           {-0.034127f, -0.022406f, -0.010589f},     {-0.017342f, -0.013249f, -0.010719f},
           {-0.0021478f, -0.0086051f, -0.0029878f},  {0.0012089f, -0.0042391f, -0.0068569f},
           {0.00090411f, -0.0066886f, -6.7547e-05f}, {0.016048f, -0.010057f, -0.028929f},
           {0.001229f, 0.010163f, 0.018861f},        {0.017264f, 0.00027257f, 0.013785f},
           {-0.013482f, -0.0036427f, 0.00067481f},   {0.0046782f, -0.0052423f, 0.0024467f},
           {-0.0059113f, -0.0062244f, -0.0018162f},  {0.015496f, 0.014582f, 0.0019514f},
           {0.0074958f, 0.0015886f, -0.0082305f},    {0.019086f, 0.001636f, -0.0039674f},
           {-0.0057021f, -0.0027307f, -0.0041066f},  {0.001745f, 0.014602f, 0.025794f},
           {-0.00082788f, 0.0022902f, 0.0045161f},   {0.011632f, 0.0089193f, -0.0072813f},
           {0.0075721f, 0.0026784f, 0.011393f},      {0.0051939f, 0.0036903f, 0.014049f},
           {-0.018383f, -0.022529f, -0.024477f},     {0.00058842f, -0.0057874f, -0.01477f},
           {-0.016125f, -0.0086101f, -0.014533f},    {0.02054f, 0.020729f, 0.0064338f},
           {0.0033587f, -0.011226f, -0.016444f},     {-0.0014742f, -0.010489f, 0.0017097f},
           {0.02813f, 0.023546f, 0.032791f},         {-0.018532f, -0.012842f, -0.0087756f},
           {-0.0080533f, -0.010771f, -0.017536f},    {-0.0039009f, 0.01615f, 0.033359f},
           {-0.0074554f, -0.014154f, -0.006191f},    {0.0034734f, -0.01137f, -0.010581f},
           {0.011476f, 0.0039281f, 0.0028231f},      {0.0071639f, -0.0014741f, -0.0038066f},
           {0.002225f, -0.0087552f, -0.0095719f},    {0.024146f, 0.021696f, 0.028056f},
           {-0.0054365f, -0.024291f, -0.017802f},    {0.0074263f, 0.01051f, 0.012705f},
           {0.0062669f, 0.0062658f, 0.019211f},      {0.016378f, 0.0094933f, 0.0066971f},
           {0.017173f, 0.023601f, 0.023296f},        {-0.014568f, -0.0098279f, -0.011556f},
           {0.014431f, 0.01443f, 0.0066362f},        {-0.006823f, 0.018863f, 0.014555f},
           {0.0061156f, 0.00347f, -0.0026662f},      {-0.0026983f, -0.0059402f, -0.0092276f},
           {0.010235f, 0.0074173f, -0.0076243f},     {-0.013255f, 0.019322f, -0.00092153f},
           {0.0024222f, -0.0048039f, -0.015759f},    {0.026244f, 0.025951f, 0.020249f},
           {0.015711f, 0.018498f, 0.0027407f},       {-0.0021714f, 0.0047214f, -0.022443f},
           {-0.0074747f, 0.0074166f, 0.01443f},      {-0.0083906f, -0.0079776f, 0.0097927f},
           {0.038321f, 0.0096622f, -0.019268f},      {-0.014605f, -0.0067032f, 0.0039675f}},
          {-0.0571f, -0.1657f, -0.2512f},
          32,
          8,
          "ComfyUI's LTX-Video latent preview factors"};
}

at::Tensor LTX::latent_frames(const at::Tensor& latents, const LatentGrid& grid) const {
  // Tokens run frame-major, then height, then width, each carrying its channels.
  if (latents.dim() != 3 || latents.size(1) != grid.frames * grid.height * grid.width)
    fail("ltx: expected latent tokens [B, {}, C], got {}", grid.frames * grid.height * grid.width,
         c10::str(latents.sizes()));
  return latents.reshape({latents.size(0), grid.frames, grid.height, grid.width, latents.size(2)})
      .permute({0, 1, 4, 2, 3});
}

std::vector<CondSpec> LTX::cond_spec() const {
  // No context mask: the LTX-2.3 connector replaces padding with registers and
  // inference passes none; a synthetic all-ones mask would change the kernel.
  return {{"video.context", {config_.text_tokens, config_.context_in_dim()}, c10::ScalarType::Float}};
}

std::optional<std::string> LTX::checkpoint_name(const std::string& stored) const {
  // The single-file checkpoint (ltx_core's loader): the DiT under
  // `model.diffusion_model.`, next to the text connectors, the text feature
  // projection, the VAEs and the vocoder, which are not part of it.
  static const std::string prefix = "model.diffusion_model.";
  for (const char* other : {"vae.", "audio_vae.", "vocoder.", "text_embedding_projection."})
    if (starts_with(stored, other)) return std::nullopt;
  const std::string name = starts_with(stored, prefix) ? stored.substr(prefix.size()) : stored;
  if (starts_with(name, "video_embeddings_connector.") || starts_with(name, "audio_embeddings_connector."))
    return std::nullopt;
  return name;
}

}  // namespace ditrl::models
