#pragma once

// Qwen-Image MMDiT (diffusers QwenImageTransformer2DModel, docs/families.md §4):
// dual-stream blocks with per-stream AdaLN-Zero modulation (img_mod /
// txt_mod), joint attention text-first with per-head q/k RMSNorm and MSRoPE,
// text through txt_norm + txt_in with an optional padding mask. Consumes the
// sigma snapshot in [0, 1] (the sinusoid scales by 1000 itself).
//
// Latent layout: the reference forward takes packed latents (B, F*h*w,
// C*p*p); noise_pred and latent_shape use the unpacked VAE latent
// (B, C, H, W) (frames = 1), so that a latent carries its own grid: img_shapes
// are (1, H/p, W/p), and noise_pred packs on the way in and unpacks the
// velocity on the way out (pure permutations).

#include <ditrl/models/adaln.hpp>
#include <ditrl/models/attention.hpp>
#include <ditrl/models/config_fields.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/qwen_image/qwen_rope.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

struct QwenImageConfig {
  // diffusers QwenImageTransformer2DModel constructor defaults (Qwen-Image).
  int64_t patch_size = 2;
  int64_t in_channels = 64;
  int64_t out_channels = 16;
  int64_t num_layers = 60;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 3584;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  // Not in config.json: text tokens per prompt (padded, with a mask), for
  // synthetic prompts and prompt datasets (the pipeline's default maximum).
  int64_t text_tokens = 512;

  // The keys of QwenImageTransformer2DModel's config.json (models/config_fields.hpp).
  template <class V>
  void fields(V& v) {
    // Variants of other Qwen-Image models (guidance-distilled, edit, layered).
    const char* variant = "a variant ditrl's qwen_image does not implement (Qwen-Image sets it false)";
    v("patch_size", patch_size, Positive{});
    v("in_channels", in_channels, Positive{});
    v("out_channels", out_channels, Positive{}, NullMeans{&in_channels});  // `out_channels or in_channels`
    v("num_layers", num_layers, Positive{});
    v("attention_head_dim", attention_head_dim, Positive{});
    v("num_attention_heads", num_attention_heads, Positive{});
    v("joint_attention_dim", joint_attention_dim, Positive{});
    v("guidance_embeds", Fixed{false, variant});
    v("axes_dims_rope", axes_dims_rope);
    v("zero_cond_t", Fixed{false, variant, false});
    v("use_additional_t_cond", Fixed{false, variant, false});
    v("use_layer3d_rope", Fixed{false, variant, false});
    v("text_tokens", text_tokens, NotInFile{}, Positive{});
  }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // "tiny" | "qwen-image".
  static QwenImageConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static QwenImageConfig from_json(const std::string& text, const std::string& source);
  // The config its reference loader reads (written next to exported weights).
  std::string to_json() const;
  void validate() const;
};

class QwenImageBlock : public torch::nn::Module {
 public:
  QwenImageBlock(const QwenImageConfig& config, AttentionBackend backend, const at::TensorOptions& options);
  // {x (B, Li, D), c (B, Lt, D), temb (B, D), image freqs, text freqs,
  // joint mask or undefined} -> {c, x}. With a tap, records the modulated
  // norm1 inputs and the attention outputs (image out0, text out1) under
  // `module` (the block's path).
  Tensors forward(const Tensors& inputs, Tap* tap = nullptr, const std::string& module = {});

  std::shared_ptr<Linear> img_mod, txt_mod;  // img_mod.1 / txt_mod.1 (after SiLU)
  std::shared_ptr<Attention> attn;
  std::shared_ptr<FeedForward> img_mlp, txt_mlp;
};

class QwenImage : public Family {
 public:
  QwenImage(const QwenImageConfig& config, const FamilyOptions& options);

  std::string family_name() const override { return "qwen_image"; }
  TimestepDomain timestep_domain() const override { return TimestepDomain::Sigma; }
  at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                        const Cond& cond, const ForwardContext& ctx) override;
  std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                      const std::string& extra_json,
                                                      const ForwardContext& ctx) override;
  std::vector<WrapUnit> wrap_units() override;
  std::vector<std::string> default_lora_targets() const override;
  std::vector<DtypeOverride> default_overrides() const override { return {}; }
  at::Tensor cfg_combine(const at::Tensor& pos, const at::Tensor& neg, const GuidanceOptions& g,
                         double timestep) const override;
  double guidance_scale(const GuidanceOptions& g, double timestep) const override;
  std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const override;
  std::vector<CondSpec> cond_spec() const override;
  // The published factors for this preset's latent channels (models/latent_preview.hpp); none: empty.
  LatentRgbFactors latent_rgb_factors() const;

  const QwenImageConfig& config() const { return config_; }

  // The diffusers forward: packed hidden_states (B, F*h*w, in_channels),
  // encoder_hidden_states (B, Lt, joint_dim), encoder_hidden_states_mask
  // (B, Lt) or undefined with `mask_on_host` its host copy (which decides
  // whether it masks anything, without reading the device), timestep sigma
  // (B,), img_shape (F, h, w) -> (B, F*h*w, p*p*out_channels).
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                     const at::Tensor& encoder_hidden_states_mask, const at::Tensor& mask_on_host,
                     const at::Tensor& timestep, const std::array<int64_t, 3>& img_shape, const ForwardContext& ctx);

  std::shared_ptr<MLPEmbedding> timestep_embedder;  // time_text_embed.timestep_embedder
  std::shared_ptr<RMSNorm> txt_norm;
  std::shared_ptr<Linear> img_in, txt_in;
  std::vector<std::shared_ptr<QwenImageBlock>> blocks;  // transformer_blocks.i
  std::shared_ptr<AdaLayerNormContinuous> norm_out;
  std::shared_ptr<Linear> proj_out;

 private:
  // The joint [text | image] attention mask, or undefined when every text
  // token is valid (read from the mask's host copy): an all-true mask is
  // dropped as the pipeline does, since its presence changes the fused kernel
  // (docs/families.md §7.2).
  at::Tensor joint_mask(const at::Tensor& text_mask, const at::Tensor& text_mask_on_host, int64_t batch,
                        int64_t text_len, int64_t image_len) const;
  void check_inputs(const at::Tensor& hidden_states, const at::Tensor& encoder_hidden_states,
                    const at::Tensor& encoder_hidden_states_mask, const at::Tensor& timestep,
                    const std::array<int64_t, 3>& img_shape) const;

  QwenImageConfig config_;
  precision::InputPolicy inputs_;
  QwenRope rope_;
};

// The family's record for the registry (models/family_traits.hpp).
extern const FamilyTraits kQwenImageTraits;

}  // namespace ditrl::models
