#pragma once

// The 2x2-patch token layout Qwen-Image's and FLUX.1's pipelines feed their
// transformers (diffusers' _pack_latents / _unpack_latents).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::models {

// (B, C, H, W) -> (B, (H/p)*(W/p), C*p*p), feature c*p*p + py*p + px.
at::Tensor pack_latents(const at::Tensor& latents, int64_t patch);
// The inverse: (B, h*w, C*p*p) -> (B, C, h*p, w*p).
at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width, int64_t patch);

}  // namespace ditrl::models
