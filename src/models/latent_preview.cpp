#include <ditrl/error.hpp>
#include <ditrl/models/flux/flux.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/models/wan/wan.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

LatentRgbFactors wan21_vae_factors() {
  return {{{-0.1299f, -0.1692f, 0.2932f},
           {0.0671f, 0.0406f, 0.0442f},
           {0.3568f, 0.2548f, 0.1747f},
           {0.0372f, 0.2344f, 0.142f},
           {0.0313f, 0.0189f, -0.0328f},
           {0.0296f, -0.0956f, -0.0665f},
           {-0.3477f, -0.4059f, -0.2925f},
           {0.0166f, 0.1902f, 0.1975f},
           {-0.0412f, 0.0267f, -0.1364f},
           {-0.1293f, 0.074f, 0.1636f},
           {0.068f, 0.3019f, 0.1128f},
           {0.0032f, 0.0581f, 0.0639f},
           {-0.1251f, 0.0927f, 0.1699f},
           {0.006f, -0.0633f, 0.0005f},
           {0.3477f, 0.2275f, 0.295f},
           {0.1984f, 0.0913f, 0.1861f}},
          {-0.1835f, -0.0868f, -0.3360f},
          8,
          1,
          "ComfyUI's Wan2.1 latent preview factors"};
}

LatentRgbFactors latent_rgb_factors(const Family& family) {
  if (const auto* f = dynamic_cast<const SD3*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const Wan*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const QwenImage*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const LTX*>(&family)) return f->latent_rgb_factors();
  if (const auto* f = dynamic_cast<const Flux*>(&family)) return f->latent_rgb_factors();
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
