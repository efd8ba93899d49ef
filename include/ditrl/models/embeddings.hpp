#pragma once

// Embeddings shared by the DiT families: the sinusoidal timestep projection
// (docs/families.md §0.1), the timestep MLP (§0.2), the text projection (§0.3) and
// the patch embedding with its 2-D sin-cos table and centre crop (§1.6).

#include <ditrl/models/linear.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
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
// TimestepEmbedding (SiLU) and PixArtAlphaTextProjection (SiLU or GELU-tanh);
// FLUX.2's linears have no bias.
class MLPEmbedding : public torch::nn::Module {
 public:
  MLPEmbedding(int64_t in, int64_t dim, int64_t out, Activation act, const at::TensorOptions& options,
               bool bias = true);
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

// A rectangle of a square grid of patches (SD3's pos_embed_max_size^2 table).
struct GridWindow {
  int64_t top = 0, left = 0, height = 0, width = 0;

  // The centre crop diffusers reads for an h x w latent (in patches) of a
  // grid x grid table.
  static GridWindow centre(int64_t grid, int64_t h, int64_t w);
  bool contains(const GridWindow& inner) const;
};

// The 2-D sin-cos table (grid*grid, dim) of diffusers' get_2d_sincos_pos_embed
// with fp32 grid coordinates index / (grid / base_size) / interpolation_scale,
// frequencies and sin/cos in fp64, stored fp32; column half first.
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, double base_size, double interpolation_scale);
// Its rows of `window` only, (window.height * window.width, dim) row-major:
// bitwise the same values (the same 1-D table, indexed), without the rest.
at::Tensor sincos_pos_embed_window(int64_t dim, int64_t grid, double base_size, double interpolation_scale,
                                   const GridWindow& window);

// SD3's PatchEmbed: Conv2d patchify, row-major tokens, plus the centre crop
// of the persistent (1, M*M, D) `pos_embed` table.
//
// Windowed (sliced training, FamilyOptions::crop_to_grid): a run reads one
// centre crop only, and SD3.5's whole table is 0.9 GB fp32 per rank, so the
// module holds just that window's rows. The registered buffer then stays on
// the meta device at its full shape (checkpoint names and validation see the
// file's tensor as before); the window is computed at construction and a
// checkpoint that carries the table overwrites it through fill_window().
class PatchEmbed : public torch::nn::Module {
 public:
  // The table is computed on `buffer_options`' device unless it is the meta
  // device; a checkpoint that carries it overwrites it on load. `window`: the
  // latent grid (in patches) whose centre crop alone is held.
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch, int64_t pos_embed_max_size, double base_size,
             const at::TensorOptions& options, const at::TensorOptions& buffer_options,
             std::optional<std::pair<int64_t, int64_t>> window = std::nullopt);
  at::Tensor forward(const at::Tensor& latent) const;  // (B, C, H, W) -> (B, h*w, D)
  // The (1, h*w, D) crop; windowed, an error unless the window holds it.
  at::Tensor cropped_pos_embed(int64_t h, int64_t w) const;

  bool windowed() const { return window_.defined(); }
  // Elements [begin, end) of the flattened full table, in a dtype fp32 holds
  // exactly (or fp64, rounded once as a whole-table copy would).
  using ReadRange = std::function<at::Tensor(int64_t begin, int64_t end)>;
  // Overwrites the window with the table `read` gives, one read per grid row
  // of the window (only the window's bytes are read). Windowed modules only.
  void fill_window(const ReadRange& read);
  // The window's values (1, height*width, D) fp32; undefined unless windowed.
  const at::Tensor& window_values() const { return window_; }

  std::shared_ptr<PatchProjection> proj;
  at::Tensor pos_embed;  // persistent buffer (meta when windowed)

 private:
  int64_t patch_, max_size_;
  GridWindow rect_;    // the held window (windowed only)
  at::Tensor window_;  // (1, rect_.height * rect_.width, D) fp32
};

// (B, h*w, p*p*C) with (py, px, c) features, c fastest -> (B, C, h*p, w*p).
at::Tensor unpatchify_2d(const at::Tensor& x, int64_t h, int64_t w, int64_t patch, int64_t channels);

}  // namespace ditrl::models
