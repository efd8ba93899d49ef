#pragma once

// FLUX's multi-axis rotary embedding (diffusers FluxPosEmbed, and FLUX.2's
// Flux2PosEmbed over four axes with theta 2000): every token carries one
// position per axis (img_ids / txt_ids, [L, axes]); axis i
// rotates its own axes_dim[i] channels of each head with frequencies
// theta^(-2j/axes_dim[i]). Angles, cos and sin are computed in fp64 and stored
// fp32, each value repeated for the (real, imaginary) pair it rotates.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ditrl::models {

class FluxRope {
 public:
  explicit FluxRope(std::vector<int64_t> axes_dim, double theta = 10000);

  // (cos, sin), each (L, sum(axes_dim)) fp32, for positions `ids` (L, axes)
  // of any dtype (read as fp32, as the reference's ids.float() does), on
  // ids' device.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& ids) const;

  // x (..., L, Dh) rotated pairwise by tables that broadcast against it
  // ((L, Dh) for (B, H, L, Dh); unsqueeze(1) them for (B, L, H, Dh)):
  // (x[2m], x[2m+1]) -> (x[2m] cos - x[2m+1] sin, x[2m+1] cos + x[2m] sin), in
  // fp32, back to x's dtype.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  const std::vector<int64_t>& axes_dim() const { return axes_dim_; }

 private:
  std::vector<int64_t> axes_dim_;
  double theta_;
};

}  // namespace ditrl::models
