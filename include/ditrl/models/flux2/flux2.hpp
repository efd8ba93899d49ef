#pragma once

// FLUX.2 (diffusers Flux2Transformer2DModel: FLUX.2-dev and FLUX.2 [klein],
// docs/families.md §10): double-stream blocks (separate image / text weights,
// joint attention text-first), then single-stream blocks over [text | image]
// whose attention and SwiGLU MLP share one input and one output projection.
// Unlike FLUX.1 the AdaLN modulation is shared: three linears at the root
// (double-stream image, double-stream text, single-stream) turn the time
// (+ guidance) embedding into shift/scale/gate once per forward, and every
// block reads the same values. No linear has a bias. RoPE over four id axes
// (flux2_rope.hpp). Consumes sigma in [0, 1] and scales it by 1000 itself.
//
// Latent layout: the reference forward takes packed tokens (B, h*w, C). The
// sampler's latent is the pipeline's own state before packing: the 2x2
// patchified VAE latent (B, in_channels, H/2, W/2) for a VAE grid H x W
// (FLUX.2's 32-channel VAE gives in_channels 128), and noise_pred packs it
// row-major (the pipeline's _pack_latents) and unpacks the velocity.

#include <ditrl/models/adaln.hpp>
#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/flux/flux_rope.hpp>
#include <ditrl/models/flux2/flux2_blocks.hpp>
#include <ditrl/models/flux2/flux2_rope.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::models {

struct Flux2Config {
  // diffusers Flux2Transformer2DModel constructor defaults (FLUX.2-dev).
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 128;
  int64_t num_layers = 8;
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  int64_t rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;
  // Not in config.json: text tokens per prompt (the pipeline pads to 512).
  int64_t text_tokens = 512;

  // The keys of Flux2Transformer2DModel's config.json (models/config_fields.hpp).
  template <class V>
  void fields(V& v) {
    v("patch_size", patch_size, Positive{});
    v("in_channels", in_channels, Positive{});
    v("out_channels", out_channels, Positive{}, NullMeans{&in_channels});  // `out_channels or in_channels`
    v("num_layers", num_layers, Positive{});
    v("num_single_layers", num_single_layers, Positive{});
    v("attention_head_dim", attention_head_dim, Positive{});
    v("num_attention_heads", num_attention_heads, Positive{});
    v("joint_attention_dim", joint_attention_dim, Positive{});
    v("timestep_guidance_channels", timestep_guidance_channels, Positive{});
    v("mlp_ratio", mlp_ratio, Positive{});
    v("axes_dims_rope", axes_dims_rope);
    v("rope_theta", rope_theta, Positive{});
    v("eps", eps, Positive{});
    v("guidance_embeds", guidance_embeds);
    v("text_tokens", text_tokens, NotInFile{}, Positive{});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // int(dim * mlp_ratio), as the reference truncates it.
  int64_t mlp_hidden_dim() const { return static_cast<int64_t>(static_cast<double>(inner_dim()) * mlp_ratio); }

  // "tiny" | "flux.2-dev" | "flux.2-klein-4b" | "flux.2-klein-9b".
  static Flux2Config preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static Flux2Config from_json(const std::string& text, const std::string& source);
  // The config its reference loader reads (written next to exported weights).
  std::string to_json() const;
  void validate() const;
};

class Flux2 : public Family {
 public:
  Flux2(const Flux2Config& config, const FamilyOptions& options);

  std::string family_name() const override { return "flux2"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Sigma; }
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  // Flux2Transformer2DModel has no _keep_in_fp32_modules: everything runs in the forward dtype.
  std::vector<DtypeOverride> default_overrides() const override { return {}; }
  // With a guidance embedding (FLUX.2-dev) rollout.guidance_scale is the
  // embedded scale (the `guidance` input models/guided.hpp adds) and real CFG runs only
  // with rollout.true_cfg_scale; without one ([klein]) guidance_scale is the
  // CFG scale, as Flux2KleinPipeline uses it.
  double guidance_scale(const GuidanceOptions& g, double timestep) const override;
  bool embeds_guidance() const override { return config_.guidance_embeds; }
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // Black Forest Labs' single files (models/flux/bfl_checkpoint.hpp).
  std::map<std::string, std::vector<io::StoredRows>> checkpoint_regrouping(const io::Checkpoint& c) const override;

  const Flux2Config& config() const { return config_; }

  // The diffusers forward: hidden_states (B, N, in_channels),
  // encoder_hidden_states (B, L, joint_dim), timestep sigma (B,), img_ids
  // (N, 4) and txt_ids (L, 4) (the reference reads batch 0's ids), guidance
  // the raw scale (B,) or undefined -> (B, N, p*p*out_channels).
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& timestep, const at::Tensor& img_ids, const at::Tensor& txt_ids,
                     const at::Tensor& guidance, const ForwardContext& ctx);

  std::shared_ptr<TimeGuidanceEmbedding> time_guidance_embed;
  std::shared_ptr<Flux2Modulation> double_stream_modulation_img, double_stream_modulation_txt, single_stream_modulation;
  std::shared_ptr<Linear> x_embedder, context_embedder;
  std::vector<std::shared_ptr<Flux2DoubleBlock>> blocks;         // transformer_blocks.i
  std::vector<std::shared_ptr<Flux2SingleBlock>> single_blocks;  // single_transformer_blocks.i
  std::shared_ptr<AdaLayerNormContinuous> norm_out;
  std::shared_ptr<Linear> proj_out;

 private:
  void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                    const at::Tensor& timestep, const at::Tensor& img_ids, const at::Tensor& txt_ids,
                    const at::Tensor& guidance) const;

  Flux2Config config_;
  precision::InputPolicy inputs_;
  FluxRope rope_;
};

// (B, C, h, w) -> (B, h*w, C), tokens row-major: the pipeline's _pack_latents.
at::Tensor flux2_pack(const at::Tensor& latents);
// The inverse: (B, h*w, C) -> (B, C, h, w).
at::Tensor flux2_unpack(const at::Tensor& tokens, int64_t height, int64_t width);

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kFlux2Traits;

}  // namespace ditrl::models
