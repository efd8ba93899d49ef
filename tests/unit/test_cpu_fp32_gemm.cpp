#include <ditrl/error.hpp>
#include <ditrl/models/onednn_linear.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <cmath>
#include <fstream>
#include <string>

using namespace ditrl::precision;
using Catch::Matchers::Contains;

namespace {

class Fp32ModeGuard {
 public:
  explicit Fp32ModeGuard(CpuFp32Gemm mode) : previous_(cpu_fp32_gemm()) { set_cpu_fp32_gemm(mode); }
  ~Fp32ModeGuard() { set_cpu_fp32_gemm(previous_); }

 private:
  CpuFp32Gemm previous_;
};

// Any fp32 sum of n products in any order is within gamma_n * sum |a_i b_i|
// of the exact one (u = 2^-24): the bound a bf16 or tf32 kernel breaks.
bool within_fp32_sum_bound(const at::Tensor& got, const at::Tensor& exact, const at::Tensor& abs_products, int64_t n) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = static_cast<double>(n) * u / (1.0 - static_cast<double>(n) * u);
  const at::Tensor diff = (got.to(at::kDouble) - exact).abs();
  return (diff <= abs_products * gamma + 1e-30).all().item<bool>();
}

std::string grad_fn_name(const at::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : "";
}

}  // namespace

TEST_CASE("cpu fp32 gemm: oneDNN's linear and its gradients are fp32 GEMMs / within the fp32 sum bound of fp64 ones",
          "[models][cpu_fp32_gemm]") {
  REQUIRE(onednn_linear_available());  // every x86-64 PyPI LibTorch has it
  Fp32ModeGuard mode(CpuFp32Gemm::Onednn);
  at::manual_seed(11);
  // 150 rows x 96 x 128: above the 2^20 multiply-adds from which linear takes oneDNN.
  const at::Tensor x = at::randn({3, 50, 96}).requires_grad_();
  const at::Tensor w = at::randn({128, 96}).requires_grad_();
  const at::Tensor b = at::randn({128}).requires_grad_();
  const at::Tensor y = ditrl::models::linear(x, w, b);
  CHECK_THAT(grad_fn_name(y), Contains("OnednnLinear"));
  REQUIRE(y.sizes() == at::IntArrayRef({3, 50, 128}));

  const at::Tensor xd = x.detach().to(at::kDouble).reshape({-1, 96}), wd = w.detach().to(at::kDouble);
  const at::Tensor bd = b.detach().to(at::kDouble);
  CHECK(within_fp32_sum_bound(y.reshape({-1, 128}), xd.mm(wd.t()) + bd, xd.abs().mm(wd.abs().t()) + bd.abs(), 97));

  const at::Tensor g = at::randn(y.sizes());
  const auto grads = torch::autograd::grad({y}, {x, w, b}, {g});
  const at::Tensor gd = g.to(at::kDouble).reshape({-1, 128});
  CHECK(grads[0].sizes() == x.sizes());
  CHECK(within_fp32_sum_bound(grads[0].reshape({-1, 96}), gd.mm(wd), gd.abs().mm(wd.abs()), 128));
  CHECK(within_fp32_sum_bound(grads[1], gd.t().mm(xd), gd.abs().t().mm(xd.abs()), 150));
  CHECK(within_fp32_sum_bound(grads[2], gd.sum(0), gd.abs().sum(0), 150));
  // The bound is tight enough to catch a wrong formula or a bf16 kernel.
  CHECK_FALSE(within_fp32_sum_bound(grads[1] * (1 + 1e-4), gd.t().mm(xd), gd.abs().t().mm(xd.abs()), 150));
  CHECK_FALSE(within_fp32_sum_bound(y.detach().to(at::kBFloat16).reshape({-1, 128}), xd.mm(wd.t()) + bd,
                                    xd.abs().mm(wd.abs().t()) + bd.abs(), 97));

  // A frozen weight without bias (a LoRA base): only x gets a gradient.
  const at::Tensor y2 = ditrl::models::linear(x, w.detach(), at::Tensor());
  CHECK_THAT(grad_fn_name(y2), Contains("OnednnLinear"));
  const auto only_x = torch::autograd::grad({y2}, {x}, {g});
  CHECK(at::equal(only_x[0], grads[0]));
  CHECK_THROWS_WITH(ditrl::models::onednn_linear(x, w.t(), b), Contains("cannot be multiplied"));
}

TEST_CASE("cpu fp32 gemm: small products and the blas mode take LibTorch's linear / same shapes give the same bits",
          "[models][cpu_fp32_gemm]") {
  REQUIRE(onednn_linear_available());  // every x86-64 PyPI LibTorch has it
  at::manual_seed(12);
  const at::Tensor x = at::randn({2, 72, 64}), w = at::randn({192, 64}), b = at::randn({192});
  {
    // 144 x 64 x 192 = 1.8M multiply-adds: oneDNN, and the same call twice is the same bits.
    Fp32ModeGuard mode(CpuFp32Gemm::Onednn);
    CHECK(at::equal(ditrl::models::linear(x, w, b), ditrl::models::onednn_linear(x, w, b)));
    CHECK(at::equal(ditrl::models::linear(x, w, b), ditrl::models::linear(x, w, b)));
    // 24 x 64 x 192 = 0.3M: below the rule, LibTorch's own call.
    const at::Tensor small = x.slice(1, 0, 12).contiguous();
    CHECK(at::equal(ditrl::models::linear(small, w, b), at::linear(small, w, b)));
  }
  Fp32ModeGuard mode(CpuFp32Gemm::Blas);
  CHECK(at::equal(ditrl::models::linear(x, w, b), at::linear(x, w, b)));
  CHECK_THAT(grad_fn_name(ditrl::models::linear(x, w.clone().requires_grad_(), b)), !Contains("Onednn"));
}

TEST_CASE("cpu fp32 gemm: widened half GEMMs run their fp32 GEMMs on the chosen kernel",
          "[models][cpu_fp32_gemm][cpu_half_gemm]") {
  REQUIRE(onednn_linear_available());  // every x86-64 PyPI LibTorch has it
  const CpuHalfGemm half = cpu_half_gemm();
  set_cpu_half_gemm(CpuHalfGemm::Widened);
  Fp32ModeGuard mode(CpuFp32Gemm::Onednn);
  at::manual_seed(13);
  const at::Tensor x = at::randn({3, 50, 96}).to(at::kBFloat16), w = at::randn({128, 96}).to(at::kBFloat16);
  const at::Tensor expected =
      ditrl::models::onednn_linear(x.to(at::kFloat), w.to(at::kFloat), at::Tensor()).to(at::kBFloat16);
  CHECK(at::equal(ditrl::models::linear(x, w, at::Tensor()), expected));
  set_cpu_half_gemm(half);
}

TEST_CASE("cpu fp32 gemm: auto is oneDNN exactly off Intel CPUs in runs that are not deterministic / names are checked",
          "[models][cpu_fp32_gemm]") {
  std::ifstream in("/proc/cpuinfo");
  bool intel = false;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("vendor_id", 0) == 0) {
      intel = line.find("GenuineIntel") != std::string::npos;
      break;
    }
  const CpuFp32Gemm off_intel = onednn_linear_available() ? CpuFp32Gemm::Onednn : CpuFp32Gemm::Blas;
  CHECK(parse_cpu_fp32_gemm("auto", false) == (intel ? CpuFp32Gemm::Blas : off_intel));
  CHECK(parse_cpu_fp32_gemm("auto", true) == CpuFp32Gemm::Blas);
  CHECK(parse_cpu_fp32_gemm("blas", false) == CpuFp32Gemm::Blas);
  if (onednn_linear_available()) CHECK(parse_cpu_fp32_gemm("onednn", true) == CpuFp32Gemm::Onednn);
  CHECK(cpu_fp32_gemm_name(CpuFp32Gemm::Onednn) == "onednn");
  CHECK(cpu_fp32_gemm_name(CpuFp32Gemm::Blas) == "blas");
  CHECK_THROWS_WITH(parse_cpu_fp32_gemm("mkl", false), Contains("expected auto, blas or onednn"));
}

// Rollout/train parity and rank invariance hand one GEMM the same values at
// other addresses. With deterministic mode's pins (MKL_CBWR=AVX2,STRICT) the
// linear's forward and both backward GEMMs keep their bits wherever the
// operands start; with MKL_CBWR=AVX2 they did not on an Intel Xeon with AMX
// (issue 51). The probe (tests/probes/gemm_alignment.cpp) pins itself as
// `ditrl train` does; it must also have moved both operands off a 64-byte
// boundary in some cases, or the sweep proves nothing.
TEST_CASE("determinism: pinned fp32 linear GEMMs keep their bits wherever the operands sit in memory",
          "[determinism]") {
  const ditrl::test::ProcessResult r = ditrl::test::run_process(
      std::string("env -u MKL_CBWR -u ATEN_CPU_CAPABILITY -u OMP_NUM_THREADS ") + DITRL_PROBE_gemm_alignment);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("MKL_CBWR=AVX2,STRICT: cases 400, mismatches 0, misaligned "));
  CHECK_THAT(r.output, !Contains("misaligned 0\n"));
}
