#include <ditrl/error.hpp>
#include <ditrl/models/flux2/flux2_rope.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

Flux2Rope::Flux2Rope(std::vector<int64_t> axes_dim, int64_t theta) : axes_dim_(std::move(axes_dim)), theta_(theta) {}

std::pair<at::Tensor, at::Tensor> Flux2Rope::tables(const at::Tensor& ids) const {
  if (ids.dim() != 2 || ids.size(1) != static_cast<int64_t>(axes_dim_.size()) || ids.is_floating_point())
    fail("flux2: position ids must be an integer tensor [N, {}], got {} {}", axes_dim_.size(),
         c10::toString(ids.scalar_type()), c10::str(ids.sizes()));
  // The reference reads the ids as fp32 and multiplies them by fp64
  // frequencies (promoted to fp64): exact for ids below 2^24.
  const at::Tensor pos = ids.to(at::kFloat);
  std::vector<at::Tensor> cos, sin;
  for (size_t i = 0; i < axes_dim_.size(); ++i) {
    const int64_t dim = axes_dim_[i];
    const at::Tensor exponent = at::arange(0, dim, 2, pos.options().dtype(at::kDouble)) / static_cast<double>(dim);
    const at::Tensor freqs = at::reciprocal(at::pow(static_cast<double>(theta_), exponent));
    const at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(i)), freqs);
    cos.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat));
    sin.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cos, -1), at::cat(sin, -1)};
}

at::Tensor Flux2Rope::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() /= 2;
  pairs.push_back(2);
  const std::vector<at::Tensor> parts = x.reshape(pairs).unbind(-1);
  const at::Tensor rotated = at::stack({-parts[1], parts[0]}, -1).flatten(-2);
  // (L, D) against (..., L, H, D): the head axis broadcasts.
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return (x.to(at::kFloat) * c + rotated.to(at::kFloat) * s).to(x.scalar_type());
}

at::Tensor flux2_image_ids(int64_t height, int64_t width) {
  const at::Tensor zero = at::zeros({1}, at::kLong);
  return at::cartesian_prod({zero, at::arange(height, at::kLong), at::arange(width, at::kLong), zero});
}

at::Tensor flux2_text_ids(int64_t text_len) {
  const at::Tensor zero = at::zeros({1}, at::kLong);
  return at::cartesian_prod({zero, zero, zero, at::arange(text_len, at::kLong)});
}

}  // namespace ditrl::models
