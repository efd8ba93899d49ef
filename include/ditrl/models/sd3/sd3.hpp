#pragma once

// Stable Diffusion 3 / 3.5 MMDiT (diffusers SD3Transformer2DModel,
// docs/families.md §1): joint image+text blocks, the optional dual self-attention
// of SD3.5-medium, a context_pre_only last block, pooled-text + timestep
// conditioning, patch embedding with the cropped sin-cos table. Consumes the
// trajectory timesteps t in [0, 1000].

#include <ditrl/models/adaln.hpp>
#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/latent_preview.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

struct SD3Config {
  // diffusers SD3Transformer2DModel constructor defaults.
  int64_t sample_size = 128;
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 18;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 18;
  int64_t joint_attention_dim = 4096;
  int64_t caption_projection_dim = 1152;
  int64_t pooled_projection_dim = 2048;
  int64_t out_channels = 16;
  int64_t pos_embed_max_size = 96;
  std::vector<int64_t> dual_attention_layers;
  bool qk_norm = false;
  // Not in config.json: text tokens per prompt the pipeline builds
  // (77 CLIP + 256 T5), used for synthetic prompts.
  int64_t text_tokens = 333;

  // The keys of SD3Transformer2DModel's config.json (models/config_fields.hpp);
  // caption_projection_dim is checked against the heads in validate().
  template <class V>
  void fields(V& v) {
    v("sample_size", sample_size, Positive{});
    v("patch_size", patch_size, Positive{});
    v("in_channels", in_channels, Positive{});
    v("num_layers", num_layers, Positive{});
    v("attention_head_dim", attention_head_dim, Positive{});
    v("num_attention_heads", num_attention_heads, Positive{});
    v("joint_attention_dim", joint_attention_dim, Positive{});
    v("caption_projection_dim", caption_projection_dim);
    v("pooled_projection_dim", pooled_projection_dim, Positive{});
    v("out_channels", out_channels, Positive{});
    v("pos_embed_max_size", pos_embed_max_size, Positive{});  // null: not supported (every checkpoint sets it)
    v("dual_attention_layers", dual_attention_layers);
    v("qk_norm", qk_norm, Coded{"rms_norm", {nullptr}});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  bool dual(int64_t layer) const;

  // "tiny" | "sd3-medium" | "sd3.5-medium" | "sd3.5-large".
  static SD3Config preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // A diffusers config.json; `source` names it in errors.
  static SD3Config from_json(const std::string& text, const std::string& source);
  // The config its reference loader reads (written next to exported weights).
  std::string to_json() const;
  void validate() const;
};

class JointTransformerBlock : public torch::nn::Module {
 public:
  JointTransformerBlock(const SD3Config& config, int64_t index, AttentionBackend backend,
                        const at::TensorOptions& options);
  // {x, c, temb} -> {c, x}, or {x} for the context_pre_only last block.
  // Records its modulation and attention outputs under `path` (its module path).
  Tensors forward(const Tensors& inputs, const ForwardContext& ctx = {}, const std::string& path = {});

  bool context_pre_only() const { return context_pre_only_; }

  std::shared_ptr<AdaLayerNormZero> norm1;
  std::shared_ptr<AdaLayerNormZero> norm1_context;             // blocks before the last
  std::shared_ptr<AdaLayerNormContinuous> norm1_context_last;  // the last block
  std::shared_ptr<Attention> attn, attn2;
  std::shared_ptr<FeedForward> ff, ff_context;

 private:
  bool context_pre_only_;
};

class SD3 : public Family {
 public:
  SD3(const SD3Config& config, const FamilyOptions& options);

  std::string family_name() const override { return "sd3"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Timestep; }
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  std::vector<DtypeOverride> default_overrides() const override { return {}; }
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // The published factors for this preset's latent channels (models/latent_preview.hpp); none: empty.
  LatentRgbFactors latent_rgb_factors() const;

  const SD3Config& config() const { return config_; }

  // The diffusers forward: hidden_states (B, C, H, W), encoder_hidden_states
  // (B, L, joint_dim), pooled_projections (B, P), timestep t (B,) -> velocity
  // (B, out_channels, H, W).
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& pooled_projections, const at::Tensor& timestep, const ForwardContext& ctx);

  std::shared_ptr<PatchEmbed> pos_embed;
  std::shared_ptr<MLPEmbedding> timestep_embedder;  // time_text_embed.timestep_embedder
  std::shared_ptr<MLPEmbedding> text_embedder;      // time_text_embed.text_embedder
  std::shared_ptr<Linear> context_embedder;
  std::vector<std::shared_ptr<JointTransformerBlock>> blocks;  // transformer_blocks.i
  std::shared_ptr<AdaLayerNormContinuous> norm_out;
  std::shared_ptr<Linear> proj_out;

 private:
  void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                    const at::Tensor& pooled_projections, const at::Tensor& timestep) const;

  SD3Config config_;
  precision::InputPolicy inputs_;
};

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kSd3Traits;

}  // namespace ditrl::models
