#include <ditrl/error.hpp>
#include <ditrl/models/flux/flux_rope.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

FluxRope::FluxRope(std::vector<int64_t> axes_dim, double theta) : axes_dim_(std::move(axes_dim)), theta_(theta) {
  for (int64_t d : axes_dim_)
    if (d <= 0 || d % 2 != 0) fail("flux rope: every axes_dims_rope entry must be positive and even, got {}", d);
}

std::pair<at::Tensor, at::Tensor> FluxRope::cos_sin(const at::Tensor& ids) const {
  if (ids.dim() != 2 || ids.size(1) != static_cast<int64_t>(axes_dim_.size()))
    fail("flux rope: position ids must be [L, {}], got {}", axes_dim_.size(), c10::str(ids.sizes()));
  // fp32 positions promoted to fp64 by the outer product with fp64 frequencies.
  const at::Tensor pos = ids.to(at::kFloat).to(at::kDouble);
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble).device(ids.device());
  std::vector<at::Tensor> cos, sin;
  for (size_t i = 0; i < axes_dim_.size(); ++i) {
    const auto dim = static_cast<double>(axes_dim_[i]);
    const at::Tensor freqs = 1.0 / at::pow(theta_, at::arange(0, axes_dim_[i], 2, f64) / dim);
    const at::Tensor angles = at::outer(pos.select(1, static_cast<int64_t>(i)), freqs);
    cos.push_back(angles.cos().repeat_interleave(2, 1).to(at::kFloat));
    sin.push_back(angles.sin().repeat_interleave(2, 1).to(at::kFloat));
  }
  return {at::cat(cos, -1), at::cat(sin, -1)};
}

at::Tensor FluxRope::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::vector<at::Tensor> pairs = x.unflatten(-1, {-1, 2}).unbind(-1);
  const at::Tensor rotated = at::stack({pairs[1].neg(), pairs[0]}, -1).flatten(-2);
  return (x.to(at::kFloat) * cos + rotated.to(at::kFloat) * sin).to(x.scalar_type());
}

}  // namespace ditrl::models
