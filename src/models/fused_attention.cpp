#include "fused_attention.hpp"

#include <ditrl/error.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>

namespace ditrl::models {

namespace {

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

// LibTorch's CPU flash backward at bf16 / fp16 makes five GEMM calls per
// (sample, head, query block) and accumulates dq, dk, dv in the half dtype;
// each call pays a fixed oneDNN set-up. While a block's work (query tokens x
// head dim) is small that cost dominates and the fp32 kernel on widened
// copies is faster (and its gradients are the more accurate): at bf16,
// 1.26-9.0x below 12288 = 192 x 64, 0.50-1.37x from there, on an AMD EPYC
// with AVX512-BF16 (benchmarks/results/flash_backward.md).
// Where half GEMMs widen anyway (precision.cpu_half_gemm), at every size.
constexpr int64_t kNativeHalfBackwardFromWork = 12288;

bool widen_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  if (!q.device().is_cpu() || !precision::is_half(q.scalar_type())) return false;
  if (mask.defined() && mask.scalar_type() != at::kBool) return false;
  if (!at::GradMode::is_enabled() || !(q.requires_grad() || k.requires_grad() || v.requires_grad())) return false;
  return precision::cpu_half_gemm() == precision::CpuHalfGemm::Widened ||
         q.size(-2) * q.size(-1) < kNativeHalfBackwardFromWork;
}

// SDPA's own conversion of a bool mask for the flash kernel: 0 where true,
// -inf where false, in the query's dtype (the same forward bits as SDPA).
std::optional<at::Tensor> additive_mask(const at::Tensor& mask, c10::ScalarType dtype) {
  if (!mask.defined()) return std::nullopt;
  return at::zeros(mask.sizes(), mask.options().dtype(dtype))
      .masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
}

// The half flash kernel forward (bit for bit what SDPA returns, so rollout and
// training agree); the backward is LibTorch's fp32 flash backward on widened
// copies, each gradient rounded once.
struct WidenedBackwardFlash : torch::autograd::Function<WidenedBackwardFlash> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const std::optional<at::Tensor>& mask) {
    const at::Tensor bool_mask = mask.value_or(at::Tensor());
    auto [out, logsumexp] =
        at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, additive_mask(bool_mask, q.scalar_type()));
    ctx->save_for_backward({q, k, v, out, logsumexp});
    if (mask) ctx->saved_data["mask"] = *mask;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor mask = ctx->saved_data.count("mask") ? ctx->saved_data["mask"].toTensor() : at::Tensor();
    using precision::to_fp32;
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        to_fp32(grads[0]), to_fp32(q), to_fp32(saved[1]), to_fp32(saved[2]), to_fp32(saved[3]), saved[4], 0.0, false,
        additive_mask(mask, at::kFloat));
    const c10::ScalarType half = q.scalar_type();
    return {dq.to(half), dk.to(half), dv.to(half), at::Tensor()};
  }
};

std::string describe(const at::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"));
}

}  // namespace

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           AttentionBackend backend) {
  const std::string_view name = name_of(kAttentionNames, backend);
  if (!q.is_cuda() && backend != AttentionBackend::Flash)
    fail("attention backend \"{}\" runs on CUDA tensors only (q is on {}); on the CPU use \"flash\" or \"math\"", name,
         q.device().str());
  if (q.is_cuda() && backend == AttentionBackend::Flash && mask.defined())
    fail(
        "attention backend \"flash\" takes no mask (this model's attention is masked); use \"efficient\", \"cudnn\" "
        "or \"math\"");
  SdpBackendGuard guard(backend);
  const std::optional<at::Tensor> attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  try {
    if (backend == AttentionBackend::Flash && widen_backward(q, k, v, mask))
      return WidenedBackwardFlash::apply(q, k, v, attn_mask);
    return at::scaled_dot_product_attention(q, k, v, attn_mask, 0.0, false);
  } catch (const c10::Error& e) {
    fail("attention backend \"{}\" cannot take q {}, k {}, v {}{}: {}", name, describe(q), describe(k), describe(v),
         mask.defined() ? " with mask " + describe(mask) : std::string(), e.what_without_backtrace());
  }
}

}  // namespace ditrl::models
