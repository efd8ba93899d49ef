// Seeded inputs every rank can draw again, so each checks a collective's
// result on its own, and the comparison against them.

#include <ditrl/app/preflight/draws.hpp>
#include <ditrl/fault_injection.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <vector>

namespace ditrl::app::preflight {

at::Tensor chunk(int from, int to, int salt, int64_t elements) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(salt) * 1000003u + static_cast<uint64_t>(from) * 1009u + static_cast<uint64_t>(to));
  return at::randn({elements}, generator, at::kFloat);
}

at::Tensor rank_input(int rank, int ranks, int salt, int64_t elements) {
  std::vector<at::Tensor> chunks;
  for (int to = 0; to < ranks; ++to) chunks.push_back(chunk(rank, to, salt, elements));
  return at::cat(chunks);
}

// DITRL_TEST_PREFLIGHT_FAULT=R (test-only): rank R's collectives deliver one
// flipped bit, the fault the bitwise checks must name.
void inject_fault(at::Tensor& received, int rank) {
  if (!fault_requested("DITRL_TEST_PREFLIGHT_FAULT", rank)) return;
  at::Tensor first = received.view(-1).slice(0, 0, 1).cpu();
  *reinterpret_cast<int32_t*>(first.data_ptr()) ^= 1;
  received.view(-1).slice(0, 0, 1).copy_(first);
}

// What a fast sum may differ by: fp32 rounding of n terms of unit normals,
// at most about n * 2^-24 * sum |x| per element (|x| < 6 here, so < 1e-4 at
// 64 ranks); 1e-3 absolute leaves a 10x margin.
constexpr double kFastSumBound = 1e-3;

Local compare(const at::Tensor& got, const at::Tensor& want, bool exact) {
  Local out;
  if (exact) {
    const int64_t differ = at::ne(got.view(at::kInt), want.view(at::kInt)).sum().item<int64_t>();
    out.passed = differ == 0;
    out.text = differ ? fmt::format("{} of {} element(s) differ bitwise from the expected result", differ, want.numel())
                      : "bitwise equal";
  } else {
    const double error = (got - want).abs().max().item<double>();
    out.passed = error <= kFastSumBound;
    out.text = fmt::format("max |error| {:.3g} (bound {:g})", error, kFastSumBound);
  }
  return out;
}

}  // namespace ditrl::app::preflight
