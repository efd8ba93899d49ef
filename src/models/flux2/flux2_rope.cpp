#include <ditrl/models/flux2/flux2_rope.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

at::Tensor flux2_image_ids(int64_t height, int64_t width) {
  const at::Tensor zero = at::zeros({1}, at::kLong);
  return at::cartesian_prod({zero, at::arange(height, at::kLong), at::arange(width, at::kLong), zero});
}

at::Tensor flux2_text_ids(int64_t text_len) {
  const at::Tensor zero = at::zeros({1}, at::kLong);
  return at::cartesian_prod({zero, zero, zero, at::arange(text_len, at::kLong)});
}

}  // namespace ditrl::models
