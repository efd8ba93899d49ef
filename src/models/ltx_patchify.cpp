#include <ditrl/error.hpp>
#include <ditrl/models/ltx_patchify.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

at::Tensor ltx_patchify(const at::Tensor& latent) {
  if (latent.dim() != 5)
    fail("ltx patchify: a video latent is (B, C, F, H, W), got shape {}", c10::str(latent.sizes()));
  return latent.flatten(2).transpose(1, 2).contiguous();
}

at::Tensor ltx_unpatchify(const at::Tensor& tokens, int64_t frames, int64_t height, int64_t width) {
  if (tokens.dim() != 3 || frames < 1 || height < 1 || width < 1 || tokens.size(1) != frames * height * width)
    fail("ltx unpatchify: tokens of shape {} are not (B, F*H*W, C) for the latent grid {}x{}x{}",
         c10::str(tokens.sizes()), frames, height, width);
  return tokens.transpose(1, 2).reshape({tokens.size(0), tokens.size(2), frames, height, width});
}

}  // namespace ditrl::models
