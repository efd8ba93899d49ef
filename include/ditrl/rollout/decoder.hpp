#pragma once

// A family's VAE decoder exported as a TorchScript module
// (tools/export_decoder.py): forward(final fp32 latents in the family's
// layout) -> uint8 RGB [B, H, W, 3] (image families) or [B, F, H, W, 3]
// (video). Loaded onto the run's device and run there, for a reward server
// that scores images (docs/rewards.md) and for the preview samples
// ([log] decoder, docs/user-guide.md).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/script.h>

#include <string>

namespace ditrl::rollout {

class Decoder {
 public:
  // `owner` prefixes every error ("reward judge", "log.decoder").
  Decoder(const std::string& path, c10::Device device, std::string owner);

  // latents [B, ...] -> uint8 RGB on the CPU, contiguous; the shape checked.
  at::Tensor decode(const at::Tensor& final_latents);

 private:
  std::string path_;
  c10::Device device_;
  std::string owner_;
  torch::jit::Module module_;
};

}  // namespace ditrl::rollout
