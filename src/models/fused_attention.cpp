#include "fused_attention.hpp"

#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

namespace ditrl::models {

namespace {

const char* backend_name(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::Flash:
      return "flash";
    case AttentionBackend::Efficient:
      return "efficient";
    case AttentionBackend::Cudnn:
      return "cudnn";
    case AttentionBackend::Math:
      break;
  }
  return "math";
}

// Enables exactly one SDPA kernel for the duration of a call (LibTorch's
// dispatcher then errors instead of falling back) and restores the process's
// switches afterwards.
class SdpBackendGuard {
 public:
  explicit SdpBackendGuard(AttentionBackend backend) {
    at::Context& c = at::globalContext();
    saved_ = {c.userEnabledFlashSDP(), c.userEnabledMemEfficientSDP(), c.userEnabledCuDNNSDP(), c.userEnabledMathSDP()};
    set({backend == AttentionBackend::Flash, backend == AttentionBackend::Efficient, backend == AttentionBackend::Cudnn,
         false});
  }
  ~SdpBackendGuard() { set(saved_); }
  SdpBackendGuard(const SdpBackendGuard&) = delete;
  SdpBackendGuard& operator=(const SdpBackendGuard&) = delete;

 private:
  struct Switches {
    bool flash, efficient, cudnn, math;
  };
  static void set(const Switches& s) {
    at::Context& c = at::globalContext();
    c.setSDPUseFlash(s.flash);
    c.setSDPUseMemEfficient(s.efficient);
    c.setSDPUseCuDNN(s.cudnn);
    c.setSDPUseMath(s.math);
  }
  Switches saved_{};
};

std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"));
}

}  // namespace

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           AttentionBackend backend) {
  const char* name = backend_name(backend);
  if (!q.is_cuda() && backend != AttentionBackend::Flash)
    fail("attention backend \"{}\" runs on CUDA tensors only (q is on {}); on the CPU use \"flash\" or \"math\"", name,
         q.device().str());
  if (q.is_cuda() && backend == AttentionBackend::Flash && mask.defined())
    fail(
        "attention backend \"flash\" takes no mask (this model's attention is masked); use \"efficient\", \"cudnn\" "
        "or \"math\"");
  SdpBackendGuard guard(backend);
  try {
    return at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
                                            0.0, false);
  } catch (const c10::Error& e) {
    fail("attention backend \"{}\" cannot take q {}, k {}, v {}{}: {}", name, describe(q), describe(k), describe(v),
         mask.defined() ? " with mask " + describe(mask) : std::string(), e.what_without_backtrace());
  }
}

}  // namespace ditrl::models
