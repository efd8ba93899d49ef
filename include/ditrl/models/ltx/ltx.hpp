#pragma once

// LTX-2 / LTX-2.3 audio-video DiT, ltx_core's LTXModel (docs/families.md §3):
// parameters under the native checkpoint names (single-file checkpoints
// prefix them with `model.diffusion_model.`), AdaLN-single with 9-row tables
// and the prompt AdaLN of cross-attention (2.3), per-head gated attention
// (2.3), weightless RMSNorm block norms, q/k RMSNorm across heads, the split
// RoPE over fractional pixel/second coordinates, and the audio stream with the
// audio<->video cross attention. The trained path is the video stream alone:
// noise_pred never passes audio, so audio weights stay frozen and unused.
// Consumes sigma in [0, 1] (x1000 inside), never the trajectory timesteps.

#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/ltx/ltx_rope.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

struct LtxConfig {
  // ltx_core's configurator defaults: a key absent from the config keeps them.
  int64_t num_attention_heads = 32;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 128;
  int64_t out_channels = 128;
  int64_t num_layers = 48;
  int64_t cross_attention_dim = 4096;
  double norm_eps = 1e-6;
  double positional_embedding_theta = 10000.0;
  std::vector<int64_t> positional_embedding_max_pos{20, 2048, 2048};
  double timestep_scale_multiplier = 1000;
  bool use_middle_indices_grid = true;
  std::string rope_type = "interleaved";  // only "split" (every LTX-2.x checkpoint) is implemented
  bool double_precision_rope = false;     // frequencies_precision = "float64"
  bool apply_gated_attention = false;
  bool cross_attention_adaln = false;
  bool use_prompt_adaln_single = true;
  bool caption_projection = true;  // !caption_proj_before_connector: caption_channels -> D inside the DiT (2.0)
  int64_t caption_channels = 3840;
  bool ff_bias = true;
  bool audio_ff_bias = true;
  bool use_keyframes_abs_pos_embedding = false;

  // The audio stream and the A/V cross attention (ltx_core's AudioVideo
  // model, which from_metadata always builds); false = LTXVideoOnlyModel.
  bool audio = true;
  int64_t audio_num_attention_heads = 32;
  int64_t audio_attention_head_dim = 64;
  int64_t audio_in_channels = 128;
  int64_t audio_out_channels = 128;
  int64_t audio_cross_attention_dim = 2048;
  std::vector<int64_t> audio_positional_embedding_max_pos{20};
  double av_ca_timestep_scale_multiplier = 1;

  // Not in the checkpoint config:
  // text tokens per prompt (Gemma connector output length), for synthetic prompts;
  int64_t text_tokens = 1024;
  // output LayerNorm and its modulation in fp32 with one rounding before
  // proj_out (a trainer under autocast) instead of ltx_core's eager
  // forward-dtype ops; identical in an fp32 forward.
  bool fp32_output_tail = true;

  // The transformer keys of ltx_core's checkpoint config (models/config_fields.hpp).
  template <class V>
  void fields(V& v) {
    v("num_attention_heads", num_attention_heads, Positive{});
    v("attention_head_dim", attention_head_dim, Positive{});
    v("in_channels", in_channels, Positive{});
    v("out_channels", out_channels, Positive{});
    v("num_layers", num_layers, Positive{});
    v("cross_attention_dim", cross_attention_dim, Positive{});
    v("norm_eps", norm_eps);
    v("positional_embedding_theta", positional_embedding_theta);
    v("positional_embedding_max_pos", positional_embedding_max_pos);
    v("timestep_scale_multiplier", timestep_scale_multiplier);
    v("use_middle_indices_grid", use_middle_indices_grid);
    v("rope_type", rope_type);
    v("frequencies_precision", double_precision_rope, Coded{"float64", {"float32", false}});
    v("apply_gated_attention", apply_gated_attention);
    v("cross_attention_adaln", cross_attention_adaln);
    v("use_prompt_adaln_single", use_prompt_adaln_single);
    v("caption_proj_before_connector", caption_projection, Coded{false, {true}});
    v("caption_channels", caption_channels, Positive{});
    v("ff_bias", ff_bias);
    v("audio_ff_bias", audio_ff_bias);
    v("use_keyframes_abs_pos_embedding", use_keyframes_abs_pos_embedding);
    v("audio_num_attention_heads", audio_num_attention_heads, Positive{});
    v("audio_attention_head_dim", audio_attention_head_dim, Positive{});
    v("audio_in_channels", audio_in_channels, Positive{});
    v("audio_out_channels", audio_out_channels, Positive{});
    v("audio_cross_attention_dim", audio_cross_attention_dim);
    v("audio_positional_embedding_max_pos", audio_positional_embedding_max_pos);
    v("av_ca_timestep_scale_multiplier", av_ca_timestep_scale_multiplier);
    v("text_tokens", text_tokens, NotInFile{}, Positive{});
    // Keys ltx_core's configurator insists on (check_config_value): any
    // other value builds a different model. Not written: ltx_core's defaults.
    const auto fixed = [](boost::json::value value) {
      const std::string why = "ltx_core builds LTX-2 with " + boost::json::serialize(value);
      return Fixed{std::move(value), why, false};
    };
    v("dropout", fixed(0.0));
    v("attention_bias", fixed(true));
    v("activation_fn", fixed("gelu-approximate"));
    v("qk_norm", fixed("rms_norm"));
    v("standardization_norm", fixed("rms_norm"));
    v("norm_elementwise_affine", fixed(false));
    v("positional_embedding_type", fixed("rope"));
    v("use_audio_video_cross_attention", fixed(true));
    // Legacy LTX-Video keys the LTX-2 model does not read.
    for (const char* key :
         {"av_cross_ada_norm", "cross_attention_norm", "double_self_attention", "num_embeds_ada_norm",
          "num_vector_embeds", "only_cross_attention", "share_ff", "upcast_attention", "use_linear_projection"})
      v(key, Ignored{});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t audio_inner_dim() const { return audio_num_attention_heads * audio_attention_head_dim; }
  int64_t adaln_rows() const { return cross_attention_adaln ? 9 : 6; }
  bool prompt_adaln() const { return cross_attention_adaln && use_prompt_adaln_single; }
  // Width of the text features the DiT takes (before its caption projection).
  int64_t context_in_dim() const { return caption_projection ? caption_channels : cross_attention_dim; }
  int64_t audio_context_in_dim() const { return caption_projection ? caption_channels : audio_cross_attention_dim; }

  // "tiny", "tiny-video", "ltx-2.3", "ltx-2.3-video", "ltx-2", "ltx-2-video".
  static LtxConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // The checkpoint-metadata config: {"transformer": {...}} (other components
  // ignored) or the transformer object itself. `strict`: unknown keys are an
  // error (a config.json); else they are ignored with a warning (a
  // checkpoint's own metadata, which may carry keys of newer ltx_core
  // features this port does not read). `source` names the text in errors.
  static LtxConfig from_json(const std::string& text, const std::string& source, bool strict = true);
  // The config its reference loader reads (written next to exported weights).
  std::string to_json() const;
  void validate() const;
};

// ltx_core AdaLayerNormSingle: the 256-wide sinusoid of the (already scaled)
// timesteps, cast to the hidden dtype, through `emb.timestep_embedder`, then
// `linear` (dim -> rows * dim) on its SiLU. Returns {linear output, embedding}.
class LtxAdaLN : public torch::nn::Module {
 public:
  LtxAdaLN(int64_t dim, int64_t rows, const at::TensorOptions& options);
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& scaled_timesteps, c10::ScalarType hidden) const;

  std::shared_ptr<MLPEmbedding> timestep_embedder;  // emb.timestep_embedder
  std::shared_ptr<Linear> linear;
};

// ltx_core Attention: q/k RMSNorm across heads (weighted), optional RoPE on q
// and k (k may use its own tables), SDPA, optional per-head gates
// 2 sigmoid(to_gate_logits(x)), `to_out.0`.
class LtxAttention : public torch::nn::Module {
 public:
  LtxAttention(int64_t query_dim, int64_t context_dim, int64_t heads, int64_t head_dim, double eps, bool gated,
               AttentionBackend backend, const at::TensorOptions& options);
  // With `ulysses` (self-attention only): x, pe and the gates are this
  // rank's tokens; q/k/v go to a head split for the attention over the whole
  // sequence and back (models/ulysses.hpp); a mask covers the whole sequence.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& context, const at::Tensor& mask, const RopeTables* pe,
                     const RopeTables* k_pe, const Ulysses* ulysses = nullptr) const;

  std::shared_ptr<RMSNorm> q_norm, k_norm;
  std::shared_ptr<Linear> to_q, to_k, to_v, to_gate_logits, to_out;  // to_out is `to_out.0`

 private:
  int64_t heads_, head_dim_;
  AttentionBackend backend_;
};

// What one stream (video or audio) hands every block (ltx_core TransformerArgs).
struct LtxStream {
  at::Tensor x;                // (B, T, D)
  at::Tensor timestep;         // (B, T' = 1 or T, rows * D) AdaLN
  at::Tensor prompt_timestep;  // (B, 1, 2 D) prompt AdaLN, or undefined
  at::Tensor context;          // (B, L, D)
  at::Tensor context_mask;     // additive, broadcastable to (B, H, T, L), or undefined
  at::Tensor self_mask;        // additive (B, 1, T, T), or undefined
  RopeTables pe;
  // A/V cross attention (undefined without the other stream)
  RopeTables cross_pe;
  at::Tensor cross_scale_shift;  // (B, T', 4 D)
  at::Tensor cross_gate;         // (B, 1, D)

  // The flat tensor list a unit runner carries, and back.
  void append_to(Tensors& out) const;
  static LtxStream from(const Tensors& in, size_t offset);
  static constexpr size_t kTensors = 12;
};

class LtxBlock : public torch::nn::Module {
 public:
  LtxBlock(const LtxConfig& config, AttentionBackend backend, const at::TensorOptions& options);
  // ltx_core BasicAVTransformerBlock.forward: video (required) and audio
  // (nullptr: the video-only path) -> (video x, audio x or undefined). With a
  // tap, records the parity dump points under `module` (the block's path):
  // the modulated self-attention inputs (".norm1", ".audio_norm1") and every
  // attention's output before its gate (".attn1", ".attn2", ".audio_attn1",
  // ".audio_attn2", ".audio_to_video_attn", ".video_to_audio_attn"), "out0".
  // With `ulysses` the video stream holds this rank's tokens (video only).
  std::pair<at::Tensor, at::Tensor> forward(const LtxStream& video, const LtxStream* audio, Tap* tap = nullptr,
                                            const std::string& module = {}, const Ulysses* ulysses = nullptr) const;

  std::shared_ptr<LtxAttention> attn1, attn2, audio_attn1, audio_attn2, audio_to_video_attn, video_to_audio_attn;
  std::shared_ptr<FeedForward> ff, audio_ff;
  at::Tensor scale_shift_table, audio_scale_shift_table;                      // [rows, D]
  at::Tensor prompt_scale_shift_table, audio_prompt_scale_shift_table;        // [2, D] (2.3)
  at::Tensor scale_shift_table_a2v_ca_video, scale_shift_table_a2v_ca_audio;  // [5, D]

 private:
  // The gated update of the text cross attention; `record` receives the attention's output.
  at::Tensor text_cross_attention(const at::Tensor& x, const LtxStream& s, const LtxAttention& attn,
                                  const at::Tensor& table, const at::Tensor& prompt_table,
                                  const std::function<void(const at::Tensor&)>& record) const;
  LtxConfig config_;
};

// One modality of the reference forward (ltx_core Modality).
struct LtxModality {
  at::Tensor latent;          // (B, T, in_channels) patchified tokens
  at::Tensor sigma;           // (B,) sigma in [0, 1]
  at::Tensor timesteps;       // B or B*T values: per-token sigma * denoise mask
  at::Tensor positions;       // (B, axes, T, 2) pixel/second bounds
  at::Tensor context;         // (B, L, context width)
  at::Tensor context_mask;    // optional: integer 0/1 (B, L) or an additive float mask
  at::Tensor attention_mask;  // optional: (B, T, T) self-attention weights in [0, 1]
  // optional: context_mask's host copy, which decides whether it masks
  // anything without reading the device (undefined: context_mask is read)
  at::Tensor context_mask_on_host;
};

class LTX : public Family {
 public:
  LTX(const LtxConfig& config, const FamilyOptions& options);

  std::string family_name() const override { return "ltx"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Sigma; }
  // latents (B, F*H*W, in_channels) tokens on FamilyOptions::latent_grid
  // (the VAE latent (B, C, F, H, W) flattened in (f, h, w) order: ltx_core's
  // VideoLatentPatchifier with patch size 1, docs/families.md §3.1); reads
  // `sigmas`, ignores `timesteps`. Conditioning "video.context" (and an
  // optional "video.context_mask"). Returns the velocity after ltx_core's x0
  // round trip (docs/algorithms.md §9.4, see ltx.cpp).
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  // Inputs video.{latent, sigma, timesteps, positions, context[, context_mask,
  // attention_mask]} and optionally audio.{...}; outputs output.video
  // (+ output.audio).
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  // None: ltx_core (and miles' LTX trainer) keep every parameter in the
  // forward dtype; only the sinusoid, the RoPE grid/angles and the x0 round
  // trip are computed in fp32 (and the output tail, fp32_output_tail).
  std::vector<DtypeOverride> default_overrides() const override { return {}; }
  bool supports_cfg() const override { return false; }
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  void check_sequence_parallel(int64_t ranks, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // The published factors for this preset's latent channels (models/latent_preview.hpp); none: empty.
  LatentRgbFactors latent_rgb_factors() const;
  // Latents [B, ...] as [B, F, C, H, W] frames.
  at::Tensor latent_frames(const at::Tensor& latents, const LatentGrid& grid) const;
  std::optional<std::string> checkpoint_name(const std::string& stored) const override;

  const LtxConfig& config() const { return config_; }
  // Parameters of the audio stream and the A/V cross attention (frozen).
  static bool is_audio_parameter(const std::string& name);

  // LTXModel.forward: velocities of the video and (when `audio` is given) the
  // audio tokens. Every block runs through ctx.run_unit. With ctx.ulysses
  // the blocks run on this rank's video tokens (text replicated: every rank
  // holds the whole context) and the output is gathered after proj_out;
  // audio is then an error.
  std::pair<at::Tensor, at::Tensor> forward(const LtxModality& video, const LtxModality* audio,
                                            const ForwardContext& ctx);

  // Top level (video): patchify_proj, adaln_single, prompt_adaln_single,
  // caption_projection, scale_shift_table [2, D], proj_out; the audio_*
  // analogues and the av_ca_* AdaLNs of the A/V cross attention.
  std::shared_ptr<Linear> patchify_proj, proj_out, audio_patchify_proj, audio_proj_out;
  std::shared_ptr<LtxAdaLN> adaln_single, prompt_adaln_single, audio_adaln_single, audio_prompt_adaln_single;
  std::shared_ptr<LtxAdaLN> av_ca_video_scale_shift_adaln_single, av_ca_audio_scale_shift_adaln_single;
  std::shared_ptr<LtxAdaLN> av_ca_a2v_gate_adaln_single, av_ca_v2a_gate_adaln_single;
  std::shared_ptr<MLPEmbedding> caption_projection, audio_caption_projection;
  at::Tensor scale_shift_table, audio_scale_shift_table;
  std::vector<std::shared_ptr<LtxBlock>> blocks;  // transformer_blocks.i

 private:
  struct StreamModules;  // the modules of one stream, by role
  StreamModules stream_modules(bool audio) const;
  // ltx_core TransformerArgsPreprocessor.prepare; `embedded` receives the
  // timestep embedding the output layer modulates with.
  LtxStream prepare(const LtxModality& m, const StreamModules& s, at::Tensor& embedded,
                    const ForwardContext& ctx) const;
  // The A/V additions of MultiModalTransformerArgsPreprocessor.prepare.
  void prepare_cross(LtxStream& stream, const LtxModality& m, const LtxModality& other, const StreamModules& s,
                     const ForwardContext& ctx) const;
  at::Tensor output(const at::Tensor& x, const at::Tensor& embedded, const StreamModules& s,
                    const ForwardContext& ctx) const;
  void check_modality(const LtxModality& m, const StreamModules& s) const;

  LtxConfig config_;
  precision::InputPolicy inputs_;
  LatentGrid grid_;
};

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kLtxTraits;

}  // namespace ditrl::models
