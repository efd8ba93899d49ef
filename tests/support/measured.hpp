#pragma once

// What a GPU test measured against its bound, printed on every run (CTest
// keeps a passing test's output in its JUnit file, gpu_tests.xml in the check
// kit), so the values can be recorded beside the bounds in the tests'
// comments: "measured: WHAT = VALUE (bound BOUND)". Bounds are 10-100x above
// the measured error where one was measured (tests/README.md).

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace ditrl::test {

inline void print_measured(const std::string& what, double value, const std::string& bound) {
  std::printf("measured: %s = %.3g (bound %s)\n", what.c_str(), value, bound.c_str());
  std::fflush(stdout);
}

// max |a - b| and max |a - b| / max(|b|, tiny) over the elements (a on any device, b's device).
inline double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(b.device(), at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}
inline double max_relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(b.device(), at::kDouble), y = b.to(at::kDouble);
  return ((x - y).abs() / y.abs().clamp_min(1e-30)).max().item<double>();
}

}  // namespace ditrl::test
