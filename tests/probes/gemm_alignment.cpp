// Launched by the determinism test: with the CPU kernels pinned as
// deterministic `ditrl train` pins them (it re-executes itself with them),
// does a layer's fp32 linear, forward and both backward GEMMs, give the same
// bits wherever its operands sit in memory? The rollout and the training
// forward, and runs at different rank counts, hand the same GEMM the same
// values at other addresses, so rollout/train parity and rank invariance
// need exactly this. Prints one line per failing case and a summary:
//   "cases C, mismatches M, misaligned I" (I: cases whose input and weight
//   both start off a 64-byte boundary; the test requires I > 0, so the
//   sweep cannot pass by never moving the operands). Exit 1 on a mismatch.
#include <ditrl/app/determinism.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>

namespace {

// `t`'s values in a fresh buffer, starting `offset` elements into it.
at::Tensor placed(const at::Tensor& t, int64_t offset) {
  at::Tensor buffer = at::empty({t.numel() + offset}, t.options());
  at::Tensor view = buffer.narrow(0, offset, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

struct Bits {
  at::Tensor out, grad_x, grad_w;
  bool moved = false;  // input and weight both off a 64-byte boundary
};

bool off_boundary(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 != 0;
}

Bits linear_bits(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& grad_out,
                 int64_t x_offset, int64_t w_offset) {
  const at::Tensor xp = placed(x, x_offset).detach().requires_grad_(true);
  const at::Tensor wp = placed(w, w_offset).detach().requires_grad_(true);
  const at::Tensor out = ditrl::models::linear(xp, wp, b);
  out.backward(grad_out);
  return {out.detach(), xp.grad(), wp.grad(), off_boundary(xp) && off_boundary(wp)};
}

}  // namespace

int main() {
  ditrl::app::pin_cpu_kernels(1);
  ditrl::precision::set_cpu_fp32_gemm(ditrl::precision::parse_cpu_fp32_gemm("auto", /*deterministic=*/true));
  at::manual_seed(0);
  int64_t cases = 0, mismatches = 0, moved = 0;
  // Rows x in x out: the tiny presets' projections (8-16 tokens, widths 8-192,
  // LoRA ranks 4-8), odd sizes, and the sizes where MKL changes kernels.
  const int64_t shapes[][3] = {{2, 64, 64},  {2, 64, 8},    {8, 64, 192},   {16, 96, 384}, {32, 8, 64},
                               {33, 17, 29}, {80, 128, 16}, {128, 64, 256}, {256, 256, 8}, {96, 1536, 64}};
  for (const auto& shape : shapes) {
    const at::Tensor x = at::randn({shape[0], shape[1]});
    const at::Tensor w = at::randn({shape[2], shape[1]});
    const at::Tensor b = at::randn({shape[2]});
    const at::Tensor grad_out = at::randn({shape[0], shape[2]});
    const Bits reference = linear_bits(x, w, b, grad_out, 0, 0);
    for (int64_t x_offset : {0, 1, 2, 3, 4, 7, 8, 15})
      for (int64_t w_offset : {0, 1, 5, 8, 13}) {
        ++cases;
        const Bits bits = linear_bits(x, w, b, grad_out, x_offset, w_offset);
        if (bits.moved) ++moved;
        const bool same = at::equal(bits.out, reference.out) && at::equal(bits.grad_x, reference.grad_x) &&
                          at::equal(bits.grad_w, reference.grad_w);
        if (same) continue;
        ++mismatches;
        fmt::print(
            "mismatch: {}x{} -> {}, input offset {}, weight offset {}: max |diff| out {:.3g} grad_x {:.3g} "
            "grad_w {:.3g}\n",
            shape[0], shape[1], shape[2], x_offset, w_offset, (bits.out - reference.out).abs().max().item<float>(),
            (bits.grad_x - reference.grad_x).abs().max().item<float>(),
            (bits.grad_w - reference.grad_w).abs().max().item<float>());
      }
  }
  fmt::print("MKL_CBWR={}: cases {}, mismatches {}, misaligned {}\n", std::getenv("MKL_CBWR"), cases, mismatches,
             moved);
  return mismatches == 0 ? 0 : 1;
}
