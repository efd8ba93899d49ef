#pragma once

// The global L2 norm of the gradient slices, bitwise the same whatever the
// shard boundaries, the rank count and the reduction order: the sum of
// squares is taken in exact integer arithmetic.
//
// With m the largest |g| over every rank (an exact Max all-reduce) and
// 2^E > m, each square g^2 (exact in fp64: fp32 has 24 significant bits) is
// scaled to d = g^2 / 2^L with L = 2E - 66, so d < 2^66, and cut into three
// 22-bit digits of floor(d), each summed as int64 (exact for up to 2^41
// elements) and all-reduced as integers. The norm is the one rounding of
// that exact integer sum, times 2^L. Squares below 2^-66 m^2 contribute
// nothing (a relative error of at most n 2^-64 of the squared norm).
// A NaN anywhere gives NaN, else an infinity gives +inf.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::shard {

// Sum over t's elements of floor(t^2 / 2^scale), as three 22-bit digits:
// the sum is hi 2^44 + mid 2^22 + lo. t is fp32; every |t| < 2^((scale + 66) / 2).
struct SquareDigits {
  int64_t hi = 0, mid = 0, lo = 0;
};
// A loop over a CPU tensor.
SquareDigits square_digits(const at::Tensor& t, int scale);
// The same digits by tensor operations on t's device, as int64 [hi, mid, lo]
// there (no host read: a GPU step reads the summed digits once).
at::Tensor square_digits_by_ops(const at::Tensor& t, int scale);

double grad_norm(const Slices& slices, dist::Communicator& comm);

}  // namespace ditrl::shard
