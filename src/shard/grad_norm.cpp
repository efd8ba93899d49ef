// The global gradient norm in exact integer arithmetic (shard/grad_norm.hpp).

#include <ditrl/shard/grad_norm.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ditrl::shard {

namespace {

__extension__ typedef __int128 Int128;

constexpr double kTwo22 = 4194304.0;             // 2^22
constexpr double kTwo44 = 17592186044416.0;      // 2^44
constexpr int kDigitsBits = 66;                  // d = g^2 / 2^L < 2^66
constexpr int64_t kOpsChunk = int64_t{1} << 22;  // elements per tensor-op pass (bounds the temporaries)

// max |g|, whether some g is NaN, whether some is infinite: on this rank.
struct Extremes {
  double max_abs = 0;
  bool nan = false, inf = false;
};

Extremes extremes(const at::Tensor& t) {
  if (!t.device().is_cpu()) {
    const at::Tensor a = t.abs();
    const bool nan = at::isnan(t).any().item<bool>();
    const bool inf = at::isinf(t).any().item<bool>();
    return {nan || t.numel() == 0 ? 0.0 : a.max().item<double>(), nan, inf};
  }
  const float* x = t.data_ptr<float>();
  Extremes out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = x[i];
    if (std::isnan(v)) {
      out.nan = true;
    } else if (std::isinf(v)) {
      out.inf = true;
    } else {
      out.max_abs = std::max(out.max_abs, static_cast<double>(std::fabs(v)));
    }
  }
  return out;
}

}  // namespace

SquareDigits square_digits(const at::Tensor& t, int scale) {
  if (!t.device().is_cpu()) return square_digits_by_ops(t, scale);
  const float* x = t.data_ptr<float>();
  const double down = std::ldexp(1.0, -scale);
  const int64_t n = t.numel();
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<SquareDigits> partial(static_cast<size_t>(blocks));
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      SquareDigits s;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        // Every operation below is exact (its result is representable).
        const double d = static_cast<double>(x[i]) * static_cast<double>(x[i]) * down;
        const double hi = std::floor(d / kTwo44);
        const double rest = d - hi * kTwo44;
        const double mid = std::floor(rest / kTwo22);
        const double lo = std::floor(rest - mid * kTwo22);
        s.hi += static_cast<int64_t>(hi);
        s.mid += static_cast<int64_t>(mid);
        s.lo += static_cast<int64_t>(lo);
      }
      partial[static_cast<size_t>(b)] = s;
    }
  });
  SquareDigits total;  // integer sums: any order gives the same
  for (const SquareDigits& s : partial) {
    total.hi += s.hi;
    total.mid += s.mid;
    total.lo += s.lo;
  }
  return total;
}

SquareDigits square_digits_by_ops(const at::Tensor& t, int scale) {
  SquareDigits total;
  const at::Tensor flat = t.reshape({-1});
  const double down = std::ldexp(1.0, -scale);
  for (int64_t begin = 0; begin < flat.numel(); begin += kOpsChunk) {
    const at::Tensor d = flat.narrow(0, begin, std::min(kOpsChunk, flat.numel() - begin)).to(at::kDouble);
    d.mul_(d).mul_(down);
    const at::Tensor hi = at::floor(d / kTwo44);
    const at::Tensor rest = d - hi * kTwo44;
    const at::Tensor mid = at::floor(rest / kTwo22);
    const at::Tensor lo = at::floor(rest - mid * kTwo22);
    const at::Tensor sums = at::stack({hi.to(at::kLong).sum(), mid.to(at::kLong).sum(), lo.to(at::kLong).sum()}).cpu();
    total.hi += sums.data_ptr<int64_t>()[0];
    total.mid += sums.data_ptr<int64_t>()[1];
    total.lo += sums.data_ptr<int64_t>()[2];
  }
  return total;
}

double grad_norm(const Slices& slices, dist::Communicator& comm) {
  std::vector<const at::Tensor*> grads;
  for (const auto& unit : slices.units)
    for (const GroupSlices& gs : unit)
      if (gs.grad.defined()) grads.push_back(&gs.grad);

  Extremes local;
  for (const at::Tensor* g : grads) {
    const Extremes e = extremes(*g);
    local = {std::max(local.max_abs, e.max_abs), local.nan || e.nan, local.inf || e.inf};
  }
  at::Tensor agreed =
      at::tensor({local.max_abs, local.nan ? 1.0 : 0.0, local.inf ? 1.0 : 0.0}, at::kDouble).to(slices.device);
  comm.all_reduce(agreed, dist::ReduceOp::Max);
  const at::Tensor seen = agreed.cpu();
  const double* s = seen.data_ptr<double>();
  if (s[1] > 0) return std::numeric_limits<double>::quiet_NaN();
  if (s[2] > 0) return std::numeric_limits<double>::infinity();
  if (s[0] == 0) return 0.0;

  int exponent = 0;
  std::frexp(s[0], &exponent);  // max = f 2^exponent, f in [0.5, 1)
  const int scale = 2 * exponent - kDigitsBits;
  SquareDigits mine;
  for (const at::Tensor* g : grads) {
    const SquareDigits d = square_digits(*g, scale);
    mine.hi += d.hi;
    mine.mid += d.mid;
    mine.lo += d.lo;
  }
  at::Tensor digits = at::tensor({mine.hi, mine.mid, mine.lo}, at::kLong).to(slices.device);
  comm.all_reduce(digits, dist::ReduceOp::Sum);
  const at::Tensor all = digits.cpu();
  const int64_t* v = all.data_ptr<int64_t>();
  const Int128 exact = (static_cast<Int128>(v[0]) << 44) + (static_cast<Int128>(v[1]) << 22) + v[2];
  return std::sqrt(std::ldexp(static_cast<double>(exact), scale));
}

}  // namespace ditrl::shard
