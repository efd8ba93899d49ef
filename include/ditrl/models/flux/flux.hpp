#pragma once

// FLUX.1 (diffusers FluxTransformer2DModel; FLUX.1-dev and -schnell):
// `num_layers` double-stream blocks (per-stream AdaLN-Zero, joint attention
// text-first with per-head q/k RMSNorm) then `num_single_layers`
// single-stream blocks over the [text | image] sequence, whose attention and
// GELU-tanh MLP run in parallel from one modulated input and are projected
// together. Rotary positions come from txt_ids / img_ids (3 axes); the AdaLN
// conditioning sums the timestep, the pooled CLIP text and (FLUX.1-dev's
// guidance distillation) the guidance-scale embeddings. Consumes the sigma
// snapshot in [0, 1] and the raw guidance scale: the model scales both by
// 1000 itself.
//
// Latent layout: as Qwen-Image's (models/packed_latents.hpp), the
// reference forward takes 2x2-packed latents (B, h*w, 64); noise_pred and
// latent_shape use the VAE latent (B, 16, H, W), packed on the way in with
// the pipeline's img_ids (0, row, col) and zero txt_ids.

#include <ditrl/models/adaln.hpp>
#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/flux/flux_rope.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/norms.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

struct FluxConfig {
  // diffusers FluxTransformer2DModel as FLUX.1-dev's transformer/config.json sets it.
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 19;
  int64_t num_single_layers = 38;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = true;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  // Not in config.json: T5 tokens per prompt (the pipeline's max_sequence_length, 512 for dev).
  int64_t text_tokens = 512;

  // The keys of FluxTransformer2DModel's config.json (models/config_fields.hpp).
  template <class V>
  void fields(V& v) {
    v("patch_size", patch_size, Positive{});
    v("in_channels", in_channels, Positive{});
    v("out_channels", out_channels, Positive{}, NullMeans{&in_channels});  // `out_channels or in_channels`
    v("num_layers", num_layers);
    v("num_single_layers", num_single_layers);
    v("attention_head_dim", attention_head_dim, Positive{});
    v("num_attention_heads", num_attention_heads, Positive{});
    v("joint_attention_dim", joint_attention_dim, Positive{});
    v("pooled_projection_dim", pooled_projection_dim, Positive{});
    v("guidance_embeds", guidance_embeds);
    v("axes_dims_rope", axes_dims_rope);
    v("text_tokens", text_tokens, NotInFile{}, Positive{});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // "tiny" | "tiny-schnell" | "flux.1-dev" | "flux.1-schnell".
  static FluxConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static FluxConfig from_json(const std::string& text, const std::string& source);
  std::string to_json() const;
  void validate() const;
};

// Rotary tables of one forward, (L, head_dim) each, over [text | image].
struct FluxRotary {
  at::Tensor cos, sin;
};

// A double-stream block: {x (B, Li, D), c (B, Lt, D), temb (B, D), cos, sin} -> {c, x}.
class FluxBlock : public torch::nn::Module {
 public:
  FluxBlock(const FluxConfig& config, AttentionBackend backend, const at::TensorOptions& options);
  Tensors forward(const Tensors& inputs, Tap* tap = nullptr, const std::string& module = {});

  std::shared_ptr<AdaLayerNormZero> norm1, norm1_context;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<FeedForward> ff, ff_context;
};

// A single-stream block on the joint sequence: {h (B, Lt+Li, D), temb, cos, sin} -> {h}.
class FluxSingleBlock : public torch::nn::Module {
 public:
  FluxSingleBlock(const FluxConfig& config, AttentionBackend backend, const at::TensorOptions& options);
  Tensors forward(const Tensors& inputs, Tap* tap = nullptr, const std::string& module = {});

  std::shared_ptr<AdaLayerNormZero> norm;  // norm.linear: (shift, scale, gate)
  std::shared_ptr<Attention> attn;         // q/k/v and their norms; no output projection
  std::shared_ptr<Linear> proj_mlp, proj_out;
};

class Flux : public Family {
 public:
  Flux(const FluxConfig& config, const FamilyOptions& options);

  std::string family_name() const override { return "flux"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Sigma; }
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  // FluxTransformer2DModel has no _keep_in_fp32_modules.
  std::vector<DtypeOverride> default_overrides() const override { return {}; }
  // Real CFG only with true_cfg_scale > 1 (FluxPipeline's do_true_cfg);
  // guidance_scale is the distilled guidance the model embeds.
  double guidance_scale(const GuidanceOptions& g, double timestep) const override;
  bool embeds_guidance() const override { return config_.guidance_embeds; }
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // Black Forest Labs' single files (models/flux/bfl_checkpoint.hpp).
  std::map<std::string, std::vector<io::StoredRows>> checkpoint_regrouping(const io::Checkpoint& c) const override;

  // ComfyUI's factors for FLUX.1's 16-channel VAE (models/latent_preview.hpp); another width: empty.
  LatentRgbFactors latent_rgb_factors() const;

  const FluxConfig& config() const { return config_; }

  // The diffusers forward: hidden_states (B, N, in_channels), encoder_hidden_states
  // (B, L, joint_dim), pooled_projections (B, pooled_dim), timestep sigma (B,),
  // img_ids (N, 3), txt_ids (L, 3), guidance (B,) raw scale or undefined
  // -> (B, N, p*p*out_channels).
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep, const at::Tensor& img_ids,
                     const at::Tensor& txt_ids, const at::Tensor& guidance, const ForwardContext& ctx);

  std::shared_ptr<MLPEmbedding> timestep_embedder, guidance_embedder, text_embedder;  // time_text_embed.*
  std::shared_ptr<Linear> context_embedder, x_embedder;
  std::vector<std::shared_ptr<FluxBlock>> blocks;               // transformer_blocks.i
  std::vector<std::shared_ptr<FluxSingleBlock>> single_blocks;  // single_transformer_blocks.i
  std::shared_ptr<AdaLayerNormContinuous> norm_out;
  std::shared_ptr<Linear> proj_out;

 private:
  void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                    const at::Tensor& pooled_projections, const at::Tensor& timestep, const at::Tensor& img_ids,
                    const at::Tensor& txt_ids, const at::Tensor& guidance) const;
  at::Tensor time_text_embedding(const at::Tensor& timestep, const at::Tensor& guidance,
                                 const at::Tensor& pooled_projections, c10::ScalarType hidden,
                                 const ForwardContext& ctx) const;

  FluxConfig config_;
  precision::InputPolicy inputs_;
  FluxRope rope_;
};

// FluxPipeline's _prepare_latent_image_ids: (h*w, 3) rows (0, row, col), row-major, in `options`.
at::Tensor flux_image_ids(int64_t h, int64_t w, const at::TensorOptions& options);

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kFluxTraits;

}  // namespace ditrl::models
