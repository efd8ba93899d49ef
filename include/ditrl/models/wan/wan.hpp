#pragma once

// Wan 2.1 / 2.2 text-to-video DiT (diffusers WanTransformer3DModel,
// docs/families.md §2): Conv3d (1,2,2) patchify of (B, C, F, H, W) video latents,
// 3-D RoPE self-attention, cross-attention to zero-padded UMT5 text (no
// mask), AdaLN-single modulation (time_proj + per-block scale_shift_table,
// added in fp32 as diffusers does). Consumes the trajectory timesteps
// t in [0, 1000].
//
// Wan2.2-T2V-A14B is two experts of identical architecture: `transformer`
// (high noise, t >= boundary_ratio * 1000) and `transformer_2` (low noise).
// With two experts the family holds both under those prefixes
// (`transformer.blocks.0...`, `transformer_2.blocks.0...`); expert_modules()
// returns the two prefix modules, whose names are the diffusers folders'
// checkpoint names, so model.weights loads `transformer/` and
// model.weights_2 loads `transformer_2/`. With one expert the names carry no
// prefix. Every noise_pred call runs one expert: the batch's timesteps must
// all route the same way.

#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/wan/wan_rope.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

struct WanConfig {
  // diffusers WanTransformer3DModel constructor defaults (the 14B expert).
  std::vector<int64_t> patch_size = {1, 2, 2};
  int64_t num_attention_heads = 40;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 16;
  int64_t out_channels = 16;
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 13824;
  int64_t num_layers = 40;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;
  // Not in a transformer's config.json: the pipeline's text length (UMT5
  // states zero-padded to 512), the number of experts and the Wan2.2
  // pipeline's boundary_ratio (expert switch at t >= ratio * 1000).
  int64_t text_tokens = 512;
  int64_t experts = 1;
  double boundary_ratio = 0.875;

  // The keys of WanTransformer3DModel's config.json (models/config_fields.hpp).
  template <class V>
  void fields(V& v) {
    const char* i2v = "an image-to-video input; ditrl's wan is text-to-video";
    v("patch_size", patch_size);
    v("num_attention_heads", num_attention_heads, Positive{});
    v("attention_head_dim", attention_head_dim, Positive{});
    v("in_channels", in_channels, Positive{});
    v("out_channels", out_channels, Positive{});
    v("text_dim", text_dim, Positive{});
    v("freq_dim", freq_dim, Positive{});
    v("ffn_dim", ffn_dim, Positive{});
    v("num_layers", num_layers, Positive{});
    v("cross_attn_norm", cross_attn_norm);
    // diffusers builds the across-heads q/k RMSNorm whatever this says.
    v("qk_norm", Fixed{"rms_norm_across_heads", "WanTransformer3DModel builds \"rms_norm_across_heads\""});
    v("eps", eps, Positive{});
    v("image_dim", Fixed{nullptr, i2v});
    v("added_kv_proj_dim", Fixed{nullptr, i2v});
    v("rope_max_seq_len", rope_max_seq_len, Positive{});
    v("pos_embed_seq_len", Fixed{nullptr, i2v});
    v("text_tokens", text_tokens, NotInFile{}, Positive{});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // "tiny" | "tiny-a14b" (two tiny experts) | "wan2.1-t2v-1.3b" |
  // "wan2.1-t2v-14b" | "wan2.2-t2v-a14b" (two experts) | "wan2.2-ti2v-5b".
  static WanConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // A diffusers config.json (one expert); `source` names it in errors.
  static WanConfig from_json(const std::string& text, const std::string& source);
  // The config its reference loader reads (written next to exported weights).
  std::string to_json() const;
  void validate() const;
};

class WanBlock : public torch::nn::Module {
 public:
  WanBlock(const WanConfig& config, AttentionBackend backend, const at::TensorOptions& options);
  // {x (B, L, D), context (B, Lt, D), timestep_proj (B, 6, D) or (B, L, 6, D),
  // rope cos, rope sin} -> {x}. With a tap, records the modulated norm1
  // output and both attention outputs under `module` (the block's path).
  // With `ulysses`, x, a per-token timestep_proj and the rope tables hold
  // this rank's tokens (models/ulysses.hpp).
  Tensors forward(const Tensors& inputs, Tap* tap = nullptr, const std::string& module = {},
                  const Ulysses* ulysses = nullptr);

  std::shared_ptr<Attention> attn1, attn2;
  std::shared_ptr<LayerNorm> norm2;  // cross-attention norm (affine, fp32); null without cross_attn_norm
  std::shared_ptr<FeedForward> ffn;
  at::Tensor scale_shift_table;  // [1, 6, D]

 private:
  int64_t dim_;
  double eps_;
};

// The modules of one WanTransformer3DModel, registered on `host` (the family
// itself, or its `transformer` / `transformer_2` prefix module).
class WanTransformer {
 public:
  WanTransformer(torch::nn::Module& host, const WanConfig& config, AttentionBackend backend,
                 const at::TensorOptions& options);

  // The diffusers forward: hidden_states (B, C, F, H, W), timestep (B,) or
  // per-token (B, F'*H'*W') t in [0, 1000], encoder_hidden_states
  // (B, Lt, text_dim) -> velocity (B, out_channels, F, H, W). Blocks run as
  // units first_unit + i; taps are named `prefix` + the module path. With
  // ctx.ulysses the blocks run on this rank's tokens and the output is
  // gathered after proj_out: every rank of the group returns the whole output.
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& timestep,
                     const at::Tensor& encoder_hidden_states, const WanRope& rope, const ForwardContext& ctx,
                     size_t first_unit, const std::string& prefix) const;

  std::shared_ptr<PatchProjection> patch_embedding;
  std::shared_ptr<MLPEmbedding> time_embedder;  // condition_embedder.time_embedder
  std::shared_ptr<Linear> time_proj;            // condition_embedder.time_proj
  std::shared_ptr<MLPEmbedding> text_embedder;  // condition_embedder.text_embedder
  std::vector<std::shared_ptr<WanBlock>> blocks;
  std::shared_ptr<Linear> proj_out;
  at::Tensor scale_shift_table;  // [1, 2, D]

 private:
  void check_inputs(const at::Tensor& hidden_states, const at::Tensor& timestep,
                    const at::Tensor& encoder_hidden_states) const;

  WanConfig config_;
};

class Wan : public Family {
 public:
  Wan(const WanConfig& config, const FamilyOptions& options);

  std::string family_name() const override { return "wan"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Timestep; }
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  std::vector<DtypeOverride> default_overrides() const override;
  double guidance_scale(const GuidanceOptions& g, double timestep) const override;
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  void check_sequence_parallel(int64_t ranks, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // The published factors for this preset's latent channels (models/latent_preview.hpp); none: empty.
  LatentRgbFactors latent_rgb_factors() const;
  // Latents [B, ...] as [B, F, C, H, W] frames.
  at::Tensor latent_frames(const at::Tensor& latents, const LatentGrid& grid) const;
  std::vector<std::shared_ptr<torch::nn::Module>> expert_modules() override;

  // The expert that denoises at trajectory timestep t: 0 (high noise,
  // t >= boundary_ratio * 1000, or the only one) or 1.
  size_t expert_for(double timestep) const override;
  const WanConfig& config() const { return config_; }
  const WanTransformer& expert(size_t i) const { return *experts_.at(i); }

 private:
  // The one expert every element of `timestep` routes to.
  size_t route(const at::Tensor& timestep) const;
  std::string prefix(size_t expert) const;

  WanConfig config_;
  precision::InputPolicy inputs_;
  WanRope rope_;
  std::vector<std::shared_ptr<torch::nn::Module>> hosts_;  // the prefix modules of two experts
  std::vector<std::unique_ptr<WanTransformer>> experts_;
};

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kWanTraits;

}  // namespace ditrl::models
