#include "fused_attention.hpp"

#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <torch/version.h>

namespace ditrl::models {

#if TORCH_VERSION_MAJOR >= 2

namespace {

// Enables exactly one fused backend for the duration of a call and restores
// the global switches afterwards.
class SdpBackendGuard {
 public:
  explicit SdpBackendGuard(bool flash)
      : flash_(at::globalContext().userEnabledFlashSDP()),
        efficient_(at::globalContext().userEnabledMemEfficientSDP()),
        math_(at::globalContext().userEnabledMathSDP()) {
    at::globalContext().setSDPUseFlash(flash);
    at::globalContext().setSDPUseMemEfficient(!flash);
    at::globalContext().setSDPUseMath(false);
  }
  ~SdpBackendGuard() {
    at::globalContext().setSDPUseFlash(flash_);
    at::globalContext().setSDPUseMemEfficient(efficient_);
    at::globalContext().setSDPUseMath(math_);
  }
  SdpBackendGuard(const SdpBackendGuard&) = delete;
  SdpBackendGuard& operator=(const SdpBackendGuard&) = delete;

 private:
  bool flash_, efficient_, math_;
};

}  // namespace

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool flash) {
  if (!q.is_cuda()) fail("attention backend {} runs on CUDA tensors only", flash ? "flash" : "efficient");
  if (flash && mask.defined()) fail("the flash attention kernel takes no mask; use \"efficient\" or \"math\"");
  SdpBackendGuard guard(flash);
  return at::scaled_dot_product_attention(q, k, v, mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt, 0.0,
                                          false);
}

#else

at::Tensor fused_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, bool flash) {
  fail("attention backend {} needs LibTorch >= 2.0 (this build has {})", flash ? "flash" : "efficient", TORCH_VERSION);
}

#endif

}  // namespace ditrl::models
