#pragma once

// LTX video latents <-> the token sequence the transformer reads (ltx_core
// VideoLatentPatchifier with patch size 1, docs/families.md §3.1): a VAE latent
// (B, C, F, H, W) becomes (B, F*H*W, C) tokens in (f, h, w) order, the order
// ltx_video_positions gives their coordinates in.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::models {

// b c f h w -> b (f h w) c
at::Tensor ltx_patchify(const at::Tensor& latent);

// b (f h w) c -> b c f h w; the token count must be frames * height * width.
at::Tensor ltx_unpatchify(const at::Tensor& tokens, int64_t frames, int64_t height, int64_t width);

}  // namespace ditrl::models
