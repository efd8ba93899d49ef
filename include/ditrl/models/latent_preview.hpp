#pragma once

// Pictures from latents without a VAE: the linear latent-to-RGB factors
// published for a family's VAE (ComfyUI's latent previews, fitted on the
// latents the DiT denoises) applied per latent cell, the way ComfyUI's and
// diffusers' previews show a sample while it denoises. Each cell becomes a
// block of the VAE's size, so the picture has the size the VAE decodes to.
// The factors live in each family's source; they are reached from here, not
// through the Family interface, which every part of ditrl includes.

#include <ditrl/models/family.hpp>

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ditrl::models {

// Per pixel, rgb = latent . weights + bias, in [-1, 1].
struct LatentRgbFactors {
  std::vector<std::array<float, 3>> weights;  // one row per latent channel; empty: none published
  std::array<float, 3> bias{};
  int64_t spatial = 8;   // pixels per latent cell along height and width (the VAE's compression)
  int64_t temporal = 1;  // video frames per latent frame
  std::string source;    // whose factors, for the logs
};

// Wan2.1's 16-channel VAE (8x spatial), which Qwen-Image shares: ComfyUI's
// latent_formats.Wan21 factors (temporal 1: a video family sets its own).
LatentRgbFactors wan21_vae_factors();

// The family's factors for its preset's latent channels (empty weights: none published).
LatentRgbFactors latent_rgb_factors(const Family& family);

// Latents [B, ...] in the family's layout as [B, F, C, H, W] frames of `grid`.
at::Tensor latent_frames(const Family& family, const at::Tensor& latents, const LatentGrid& grid);

// One sample's frames [F, C, H, W] (any float dtype and device) ->
// [F, H * spatial, W * spatial, 3] uint8 on the CPU, where a channel value
// v in [-1, 1] maps to round((v + 1) / 2 * 255), clamped. Throws when the
// factors have no row per latent channel, naming both counts.
at::Tensor latent_preview(const at::Tensor& frames, const LatentRgbFactors& factors);

}  // namespace ditrl::models
