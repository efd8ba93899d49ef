#include <ditrl/models/onednn_linear.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

namespace ditrl::models {

namespace {

using precision::to_fp32;

// Only operands of one half dtype: a mixed pair stays LibTorch's error.
bool widen(const at::Tensor& x, const at::Tensor& weight) {
  const c10::ScalarType t = x.scalar_type();
  return precision::is_half(t) && weight.scalar_type() == t && x.device().is_cpu() &&
         precision::cpu_half_gemm() == precision::CpuHalfGemm::Widened;
}

// oneDNN's call costs 6-9 us more than the BLAS's; below about 2^20
// multiply-adds that outweighs its faster kernel (benchmarks/results/fp32_gemm.md).
constexpr int64_t kOnednnMinMacs = int64_t{1} << 20;

// A function of the shapes alone, so rollout and training, which cut their
// batches alike, run every GEMM on the same kernel.
// a: the rows x inner operand; the product has `columns` columns.
bool onednn(const at::Tensor& a, const at::Tensor& b, int64_t columns) {
  return a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.device().is_cpu() &&
         precision::cpu_fp32_gemm() == precision::CpuFp32Gemm::Onednn && a.numel() * columns >= kOnednnMinMacs;
}

bool onednn_linear_fits(const at::Tensor& x, const at::Tensor& weight) {
  return onednn(x, weight, weight.size(0));
}

// The fp32 GEMMs of the widened path, on the fp32 kernel the run chose.
at::Tensor fp32_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return onednn_linear_fits(x, weight) ? onednn_linear(x, weight, bias) : at::linear(x, weight, bias);
}

at::Tensor fp32_mm(const at::Tensor& a, const at::Tensor& b) {
  return onednn(a, b, b.size(1)) ? onednn_mm(a, b) : a.mm(b);
}

// Saves the half inputs (not their fp32 copies) and widens again in backward.
struct WidenedLinear : torch::autograd::Function<WidenedLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    if (bias) ctx->saved_data["bias_dtype"] = bias->scalar_type();
    return fp32_linear(to_fp32(x), to_fp32(weight), bias ? to_fp32(*bias) : at::Tensor()).to(x.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor g = grads[0].to(at::kFloat).reshape({-1, weight.size(0)});
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = fp32_mm(g, to_fp32(weight)).to(x.scalar_type()).view(x.sizes());
    if (ctx->needs_input_grad(1))
      grad_weight = fp32_mm(g.t(), to_fp32(x).reshape({-1, x.size(-1)})).to(weight.scalar_type());
    // An absent bias is no autograd input: its edge index does not exist.
    if (ctx->saved_data.count("bias_dtype") && ctx->needs_input_grad(2))
      grad_bias = g.sum(0).to(ctx->saved_data["bias_dtype"].toScalarType());
    return {grad_x, grad_weight, grad_bias};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (onednn_linear_fits(x, weight)) return onednn_linear(x, weight, bias);
  if (!widen(x, weight)) return at::linear(x, weight, bias);
  return WidenedLinear::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

at::Tensor patch_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const std::vector<int64_t>& patch) {
  const auto conv = [&patch](const at::Tensor& in, const at::Tensor& w, const at::Tensor& b) {
    return patch.size() == 2 ? at::conv2d(in, w, b, patch) : at::conv3d(in, w, b, patch);
  };
  // One per forward, on the latents: its fp32 copies in the graph are small.
  if (!widen(x, weight)) return conv(x, weight, bias);
  return conv(to_fp32(x), to_fp32(weight), to_fp32(bias)).to(x.scalar_type());
}

}  // namespace ditrl::models
