#pragma once

// Embeddings shared by the DiT families: the sinusoidal timestep projection
// (families.md §0.1), the timestep MLP (§0.2), the text projection (§0.3) and
// the patch embedding with its 2-D sin-cos table and centre crop (§1.6).

#include <ditrl/models/linear.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ditrl::models {

struct SinusoidOptions {
  int64_t dim = 256;
  bool flip_sin_to_cos = true;  // [cos | sin] instead of [sin | cos]
  double shift = 0;             // downscale_freq_shift
  double scale = 1;             // applied after t * f (Qwen-Image: 1000)
  double max_period = 10000;
};

// diffusers get_timestep_embedding in its exact op order, fp32: t (N,) of any
// floating dtype -> (N, dim).
at::Tensor timestep_sinusoid(const at::Tensor& t, const SinusoidOptions& options);

enum class Activation { SiLU, GeluTanh };
at::Tensor activate(const at::Tensor& x, Activation act);

// linear_1 (in -> dim), activation, linear_2 (dim -> out). diffusers'
// TimestepEmbedding (SiLU) and PixArtAlphaTextProjection (SiLU or GELU-tanh).
class MLPEmbedding : public torch::nn::Module {
 public:
  MLPEmbedding(int64_t in, int64_t dim, int64_t out, Activation act, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const { return linear_2->forward(activate(linear_1->forward(x), act_)); }

  std::shared_ptr<Linear> linear_1, linear_2;

 private:
  Activation act_;
};

// A convolution whose kernel equals its stride (patchify): weight
// [D, C, *patch] and bias [D]; 2-D or 3-D by the weight's rank.
class PatchProjection : public torch::nn::Module {
 public:
  PatchProjection(int64_t in_channels, int64_t dim, const std::vector<int64_t>& patch,
                  const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;

  at::Tensor weight, bias;

 private:
  std::vector<int64_t> patch_;
};

// The 2-D sin-cos table (grid*grid, dim) of diffusers' get_2d_sincos_pos_embed
// with fp32 grid coordinates index / (grid / base_size) / interpolation_scale,
// frequencies and sin/cos in fp64, stored fp32; column half first.
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, double base_size, double interpolation_scale);

// SD3's PatchEmbed: Conv2d patchify, row-major tokens, plus the centre crop
// of the persistent (1, M*M, D) `pos_embed` table.
class PatchEmbed : public torch::nn::Module {
 public:
  // The table is computed on `buffer_options`' device unless it is the meta
  // device; a checkpoint that carries it overwrites it on load.
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch, int64_t pos_embed_max_size, double base_size,
             const at::TensorOptions& options, const at::TensorOptions& buffer_options);
  at::Tensor forward(const at::Tensor& latent) const;  // (B, C, H, W) -> (B, h*w, D)
  at::Tensor cropped_pos_embed(int64_t h, int64_t w) const;

  std::shared_ptr<PatchProjection> proj;
  at::Tensor pos_embed;  // persistent buffer

 private:
  int64_t patch_, max_size_;
};

// (B, h*w, p*p*C) with (py, px, c) features, c fastest -> (B, C, h*p, w*p).
at::Tensor unpatchify_2d(const at::Tensor& x, int64_t h, int64_t w, int64_t patch, int64_t channels);

}  // namespace ditrl::models
