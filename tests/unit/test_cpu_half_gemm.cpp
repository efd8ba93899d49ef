#include <ditrl/error.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>

using namespace ditrl::precision;
using Catch::Matchers::Contains;

namespace {

// Sets the process-wide mode for one test and puts the previous one back.
class ModeGuard {
 public:
  explicit ModeGuard(CpuHalfGemm mode) : previous_(cpu_half_gemm()) { set_cpu_half_gemm(mode); }
  ~ModeGuard() { set_cpu_half_gemm(previous_); }

 private:
  CpuHalfGemm previous_;
};

bool cpuinfo_flag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

// |a - b| within one rounding of `dtype` at b's magnitude, element by element.
bool within_one_rounding(const at::Tensor& a, const at::Tensor& b, c10::ScalarType dtype) {
  const double eps = dtype == at::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const at::Tensor diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  return (diff <= b.to(at::kDouble).abs() * eps + 1e-30).all().item<bool>();
}

}  // namespace

TEST_CASE("cpu half gemm: widened is the fp32 GEMM of the half operands rounded once / native is LibTorch's kernel",
          "[models][cpu_half_gemm]") {
  at::manual_seed(3);
  for (const c10::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor x = at::randn({3, 17, 96}).to(dtype);
    const at::Tensor w = at::randn({80, 96}).to(dtype);
    const at::Tensor b = at::randn({80}).to(dtype);
    for (const bool bias : {true, false}) {
      const at::Tensor bb = bias ? b : at::Tensor();
      {
        ModeGuard mode(CpuHalfGemm::Widened);
        const at::Tensor expected =
            at::linear(x.to(at::kFloat), w.to(at::kFloat), bias ? b.to(at::kFloat) : at::Tensor()).to(dtype);
        const at::Tensor y = ditrl::models::linear(x, w, bb);
        CHECK(y.scalar_type() == dtype);
        CHECK(at::equal(y, expected));
      }
      {
        ModeGuard mode(CpuHalfGemm::Native);
        CHECK(at::equal(ditrl::models::linear(x, w, bb), at::linear(x, w, bb)));
      }
    }
    // fp32 operands never widen: the same kernel in both modes; a mixed
    // pair is LibTorch's dtype error, not a silent cast.
    ModeGuard mode(CpuHalfGemm::Widened);
    const at::Tensor xf = x.to(at::kFloat), wf = w.to(at::kFloat);
    CHECK(at::equal(ditrl::models::linear(xf, wf, at::Tensor()), at::linear(xf, wf)));
    CHECK_THROWS(ditrl::models::linear(x, wf, at::Tensor()));
  }
}

TEST_CASE("cpu half gemm: widened gradients are the exact ones rounded once / a frozen weight gets none",
          "[models][cpu_half_gemm]") {
  ModeGuard mode(CpuHalfGemm::Widened);
  at::manual_seed(5);
  const c10::ScalarType dtype = at::kBFloat16;
  const at::Tensor x = at::randn({2, 9, 64}).to(dtype).requires_grad_();
  const at::Tensor w = at::randn({48, 64}).to(dtype).requires_grad_();
  const at::Tensor b = at::randn({48}).to(dtype).requires_grad_();
  const at::Tensor y = ditrl::models::linear(x, w, b);
  REQUIRE(y.grad_fn());
  // The node keeps the half inputs; a composite of casts would keep fp32 copies.
  CHECK_THAT(y.grad_fn()->name(), Contains("WidenedLinear"));
  const at::Tensor g = at::randn(y.sizes()).to(dtype);
  const auto grads = torch::autograd::grad({y}, {x, w, b}, {g});

  // fp64 sums of the same half values, rounded to the half dtype.
  const at::Tensor gd = g.to(at::kDouble).reshape({-1, 48}), xd = x.detach().to(at::kDouble).reshape({-1, 64});
  const at::Tensor wd = w.detach().to(at::kDouble);
  CHECK(grads[0].scalar_type() == dtype);
  CHECK(grads[0].sizes() == x.sizes());
  CHECK(within_one_rounding(grads[0], gd.mm(wd).to(dtype).view(x.sizes()), dtype));
  CHECK(within_one_rounding(grads[1], gd.t().mm(xd).to(dtype), dtype));
  CHECK(within_one_rounding(grads[2], gd.sum(0).to(dtype), dtype));
  // A wrong formula (say W^T in place of W) is far outside one rounding.
  CHECK_FALSE(within_one_rounding(grads[1], (gd.t().mm(xd) * 1.01).to(dtype), dtype));

  // LoRA freezes the base weight and has no bias: only x gets a gradient.
  const at::Tensor frozen = w.detach();
  const at::Tensor y2 = ditrl::models::linear(x, frozen, at::Tensor());
  const auto only_x = torch::autograd::grad({y2}, {x}, {g});
  CHECK(within_one_rounding(only_x[0], gd.mm(wd).to(dtype).view(x.sizes()), dtype));
}

TEST_CASE("cpu half gemm: auto widens exactly where the CPU has no AVX512-BF16 or AMX-BF16 / names are checked",
          "[models][cpu_half_gemm]") {
  const bool native = cpuinfo_flag("avx512_bf16") || cpuinfo_flag("amx_bf16");
  CHECK(parse_cpu_half_gemm("auto") == (native ? CpuHalfGemm::Native : CpuHalfGemm::Widened));
  CHECK(parse_cpu_half_gemm("native") == CpuHalfGemm::Native);
  CHECK(parse_cpu_half_gemm("widened") == CpuHalfGemm::Widened);
  CHECK(cpu_half_gemm_name(CpuHalfGemm::Widened) == "widened");
  CHECK_THROWS_WITH(parse_cpu_half_gemm("fp32"), Contains("expected auto, native or widened"));
}
