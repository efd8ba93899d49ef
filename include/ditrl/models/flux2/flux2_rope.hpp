#pragma once

// FLUX.2's rotary embedding over four position axes (diffusers Flux2PosEmbed,
// docs/families.md §10): each token carries integer ids (t, h, w, l); axis i
// rotates axes_dim[i] channels of every head by id_i * theta^(-2k/axes_dim[i]),
// with the frequencies and angles in fp64, their cos/sin stored fp32 and each
// value repeated for the (real, imaginary) pair it rotates. Image tokens sit at
// (0, row, col, 0), text token j at (0, 0, 0, j) (the pipeline's
// _prepare_latent_ids / _prepare_text_ids).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ditrl::models {

class Flux2Rope {
 public:
  Flux2Rope(std::vector<int64_t> axes_dim, int64_t theta);

  // (cos, sin), each (N, head_dim) fp32, for ids (N, 4) of any integer dtype.
  std::pair<at::Tensor, at::Tensor> tables(const at::Tensor& ids) const;

  // x (..., L, H, head_dim) rotated by the tables (L, head_dim) as interleaved
  // (x[2m], x[2m+1]) pairs, in fp32, back to x's dtype.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  std::vector<int64_t> axes_dim_;
  int64_t theta_;
};

// The pipeline's ids: image tokens of an h x w grid, row-major (h*w, 4), and
// `text_len` text tokens (text_len, 4); int64.
at::Tensor flux2_image_ids(int64_t height, int64_t width);
at::Tensor flux2_text_ids(int64_t text_len);

}  // namespace ditrl::models
