#pragma once

// Bitwise equality of two tensors on any devices: the same dtype, shape and
// bytes (both undefined counts as equal), so -0.0 != 0.0 and NaN == NaN.

#include <ATen/ATen.h>

namespace ditrl::test {

inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  const at::Tensor x = a.cpu().contiguous(), y = b.cpu().contiguous();
  return x.scalar_type() == y.scalar_type() && x.sizes() == y.sizes() &&
         at::equal(x.view(at::kByte), y.view(at::kByte));
}

}  // namespace ditrl::test
