#pragma once

// LTX-2 rotary position embedding (docs/families.md §3.5, ltx_core rope.py, SPLIT
// layout): tokens carry [start, end) bounds in pixel/second units; the
// midpoint over max_pos gives a fractional coordinate per axis; the angles
// (frequency-major, axis-minor) are front-padded to inner/2 entries and each
// head takes its own contiguous slice, so heads see different frequencies.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::models {

// cos and sin of the rotation angles, (B, heads, T, inner / (2 heads)).
struct RopeTables {
  at::Tensor cos, sin;
};

struct RopeOptions {
  int64_t inner_dim = 0;  // width of the rotated q/k (all heads)
  int64_t heads = 0;
  std::vector<int64_t> max_pos;  // one per position axis
  double theta = 10000.0;
  // frequencies_precision "float64": the grid in float64 with numpy's
  // linspace/pow recipe, rounded once to fp32; else torch's fp32 recipe.
  bool double_precision = true;
  bool middle = true;  // use_middle_indices_grid: midpoint of [start, end), else start
};

// The per-axis frequencies (pi/2) theta^(j / (n - 1)), j < n = inner / (2 axes),
// as fp32 on the CPU. The float64 recipe is evaluated on the host
// (std::pow, numpy's linspace), so it is the same on every machine.
at::Tensor ltx_frequency_grid(double theta, int64_t axes, int64_t inner_dim, bool double_precision);

// positions (B, axes, T, 2) fp32 -> cos/sin in `dtype`. Angles and their
// cos/sin are computed in fp32 on the positions' device (ltx_core's
// precompute_freqs_cis), then cast.
RopeTables ltx_rope_tables(const at::Tensor& positions, const RopeOptions& options, c10::ScalarType dtype);

// ltx_core apply_split_rotary_emb: x (B, T, heads * Dh) rotated in its own
// dtype, each head's halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
at::Tensor apply_ltx_rope(const at::Tensor& x, const RopeTables& pe);

// Pixel/second bounds (B, 3, F*H*W, 2) fp32 of video latent tokens in (f, h, w)
// order: latent bounds [i, i+1) scaled by the VAE factors (8, 32, 32), the
// causal time fix max(0, t + 1 - 8), time divided by fps (ltx_core
// VideoLatentTools + get_pixel_coords).
at::Tensor ltx_video_positions(int64_t batch, int64_t frames, int64_t height, int64_t width, double fps,
                               const at::Device& device);

}  // namespace ditrl::models
