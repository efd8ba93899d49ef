#include <ditrl/models/packed_latents.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

at::Tensor pack_latents(const at::Tensor& latents, int64_t patch) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2) / patch, w = latents.size(3) / patch;
  return latents.view({b, c, h, patch, w, patch}).permute({0, 2, 4, 1, 3, 5}).reshape({b, h * w, c * patch * patch});
}

at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width, int64_t patch) {
  const int64_t b = packed.size(0), h = height / patch, w = width / patch, c = packed.size(2) / (patch * patch);
  return packed.view({b, h, w, c, patch, patch}).permute({0, 3, 1, 4, 2, 5}).reshape({b, c, height, width});
}

}  // namespace ditrl::models
