#include <ditrl/error.hpp>
#include <ditrl/rollout/decoder.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <filesystem>
#include <utility>

namespace ditrl::rollout {

Decoder::Decoder(const std::string& path, c10::Device device, std::string owner)
    : path_(path), device_(device), owner_(std::move(owner)) {
  if (!std::filesystem::exists(path_)) fail("{}: decoder module {}: no such file", owner_, path_);
  try {
    module_ = torch::jit::load(path_, device_);
  } catch (const c10::Error& e) {
    fail("{}: decoder module {}: torch::jit::load onto {} failed: {}", owner_, path_, device_.str(),
         e.what_without_backtrace());
  }
  module_.eval();
}

at::Tensor Decoder::decode(const at::Tensor& final_latents) {
  torch::NoGradGuard no_grad;
  torch::jit::IValue out;
  try {
    out = module_.forward({final_latents.to(device_, at::kFloat)});
  } catch (const std::exception& e) {
    fail("{}: decoder module {}: forward on {} failed: {}", owner_, path_, device_.str(), e.what());
  }
  if (!out.isTensor()) fail("{}: decoder module {}: forward must return a tensor", owner_, path_);
  const at::Tensor images = out.toTensor();
  const int64_t n = final_latents.size(0);
  if (images.scalar_type() != at::kByte || (images.dim() != 4 && images.dim() != 5) || images.size(0) != n ||
      images.size(-1) != 3)
    fail("{}: decoder module {}: expected uint8 [{}, H, W, 3] or [{}, F, H, W, 3], got {} [{}]", owner_, path_, n, n,
         c10::toString(images.scalar_type()), fmt::join(images.sizes(), ", "));
  return images.cpu().contiguous();
}

}  // namespace ditrl::rollout
