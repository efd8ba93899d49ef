#include <ditrl/error.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/models/wan/wan.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

LatentRgbFactors latent_rgb_factors(const Family& family) {
  if (const auto* f = dynamic_cast<const SD3*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const Wan*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const QwenImage*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const LTX*>(&family)) return f->latent_rgb_factors();
  return {};
}

at::Tensor latent_frames(const Family& family, const at::Tensor& latents, const LatentGrid& grid) {
  if (const auto* f = dynamic_cast<const Wan*>(&family)) return f->latent_frames(latents, grid);
  if (const auto* f = dynamic_cast<const LTX*>(&family)) return f->latent_frames(latents, grid);
  // The image families' latents are [B, C, H, W].
  if (latents.dim() != 4)
    fail("{}: expected image latents [B, C, H, W], got {}", family.family_name(), c10::str(latents.sizes()));
  return latents.unsqueeze(1);
}

at::Tensor latent_preview(const at::Tensor& frames, const LatentRgbFactors& factors) {
  if (frames.dim() != 4) fail("latent preview: expected frames [F, C, H, W], got {}", c10::str(frames.sizes()));
  const auto channels = static_cast<int64_t>(factors.weights.size());
  if (channels == 0 || frames.size(1) != channels)
    fail("latent preview: the latents have {} channels, the RGB factors ({}) {} rows", frames.size(1),
         factors.source.empty() ? "none published" : factors.source, channels);
  at::Tensor weights = at::empty({channels, 3}, at::kFloat);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k = 0; k < 3; ++k) weights[c][k] = factors.weights[static_cast<size_t>(c)][static_cast<size_t>(k)];
  const at::Tensor bias = at::tensor({factors.bias[0], factors.bias[1], factors.bias[2]}, at::kFloat);
  const at::Tensor x = frames.to(at::kCPU, at::kFloat);
  const at::Tensor rgb = at::einsum("fchw,ck->fhwk", {x, weights}) + bias;
  const at::Tensor pixels = ((rgb + 1) / 2).clamp(0, 1).mul(255).round().to(at::kByte);
  const int64_t s = factors.spatial;
  return pixels.repeat_interleave(s, 1).repeat_interleave(s, 2).contiguous();
}

}  // namespace ditrl::models
