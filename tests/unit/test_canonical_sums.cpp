// The canonical summation tree (dist/reduction.hpp), its streaming form
// (shard/tree_sum.hpp) and the exact gradient norm digits (shard/grad_norm.hpp).
#include <ditrl/dist/reduction.hpp>
#include <ditrl/shard/grad_norm.hpp>
#include <ditrl/shard/tree_sum.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "same_bits.hpp"

#include <cmath>
#include <vector>

using namespace ditrl;
using test::same_bits;

namespace {

// T(lo, hi) over rows of `leaves` by the recursive definition.
at::Tensor tree(const at::Tensor& leaves, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return leaves[lo].clone();
  const int64_t p = dist::tree_split(hi - lo);
  return tree(leaves, lo, lo + p) + tree(leaves, lo + p, hi);
}

}  // namespace

TEST_CASE("canonical tree: splits and the bit-reversed rank order", "[dist][tree]") {
  CHECK(dist::tree_split(2) == 1);
  CHECK(dist::tree_split(3) == 2);
  CHECK(dist::tree_split(4) == 2);
  CHECK(dist::tree_split(7) == 4);
  CHECK(dist::tree_split(8) == 4);
  CHECK(dist::chunk_leaf_order(4) == std::vector<int>{0, 2, 1, 3});
  CHECK(dist::chunk_leaf_order(8) == std::vector<int>{0, 4, 2, 6, 1, 5, 3, 7});
  CHECK(dist::chunk_leaf_order(3) == std::vector<int>{0, 1, 2});
}

TEST_CASE("tree sum: the streaming sum is the tree and continues any aligned block's subtree", "[shard][tree]") {
  // Values of mixed magnitude make every grouping round differently.
  const at::Tensor leaves = at::randn({13, 257}, at::kFloat) * at::pow(10.0, at::randint(-6, 6, {13, 1}));
  for (int64_t n = 1; n <= 13; ++n) {
    shard::TreeSum sum;
    for (int64_t i = 0; i < n; ++i) sum.add(leaves[i]);
    at::Tensor out = at::zeros({257});
    sum.fold_into(out);
    CHECK(same_bits(out, tree(leaves, 0, n)));
    CHECK(sum.empty());
  }
  // 12 leaves cut into blocks of 4: the blocks' tree sums streamed give the whole tree.
  shard::TreeSum blocks;
  for (int64_t b = 0; b < 3; ++b) blocks.add(tree(leaves, 4 * b, 4 * b + 4));
  at::Tensor out = at::zeros({257});
  blocks.fold_into(out);
  CHECK(same_bits(out, tree(leaves, 0, 12)));
  // A sequential sum is another grouping: the test would see the difference.
  at::Tensor sequential = leaves[0].clone();
  for (int64_t i = 1; i < 12; ++i) sequential += leaves[i];
  CHECK_FALSE(same_bits(sequential, out));
}

TEST_CASE("tree sum of chunks: bit-reversed leaves at 4 ranks / accumulation and Avg", "[dist][tree]") {
  const at::Tensor chunks = at::randn({4, 100}, at::kFloat) * at::pow(10.0, at::randint(-5, 5, {4, 1}));
  at::Tensor out = at::empty({100});
  dist::tree_sum_of_chunks(chunks, out, /*average=*/false);
  CHECK(same_bits(out, (chunks[0] + chunks[2]) + (chunks[1] + chunks[3])));
  dist::tree_sum_of_chunks(chunks, out, /*average=*/true);
  CHECK(same_bits(out, ((chunks[0] + chunks[2]) + (chunks[1] + chunks[3])) / 4));
  // bf16 chunks accumulate in fp32 and round once.
  const at::Tensor half = chunks.to(at::kBFloat16);
  at::Tensor out16 = at::empty({100}, at::kBFloat16);
  dist::tree_sum_of_chunks(half, out16, false);
  const at::Tensor f = half.to(at::kFloat);
  CHECK(at::equal(out16, ((f[0] + f[2]) + (f[1] + f[3])).to(at::kBFloat16)));
}

TEST_CASE("grad norm digits: exact integers whatever the cut / loop and tensor forms agree", "[shard][norm]") {
  const at::Tensor g = at::randn({100003}, at::kFloat) * at::pow(10.0, at::randint(-8, 3, {100003}));
  int exponent = 0;
  std::frexp(g.abs().max().item<double>(), &exponent);
  const int scale = 2 * exponent - 66;
  const shard::SquareDigits whole = shard::square_digits(g, scale);
  const at::Tensor ops = shard::square_digits_by_ops(g, scale);
  CHECK(ops.scalar_type() == at::kLong);
  CHECK(ops[0].item<int64_t>() == whole.hi);
  CHECK(ops[1].item<int64_t>() == whole.mid);
  CHECK(ops[2].item<int64_t>() == whole.lo);
  // Cut at arbitrary shard boundaries: the digit sums add up exactly.
  for (int64_t cut : {int64_t{1}, int64_t{33333}, int64_t{65536}, int64_t{100002}}) {
    const shard::SquareDigits a = shard::square_digits(g.narrow(0, 0, cut), scale);
    const shard::SquareDigits b = shard::square_digits(g.narrow(0, cut, g.numel() - cut), scale);
    CHECK(a.hi + b.hi == whole.hi);
    CHECK(a.mid + b.mid == whole.mid);
    CHECK(a.lo + b.lo == whole.lo);
  }
  // The value: the fp64 sum of squares within the truncation bound.
  const double exact = std::ldexp(static_cast<double>(whole.hi), 44 + scale) +
                       std::ldexp(static_cast<double>(whole.mid), 22 + scale) +
                       std::ldexp(static_cast<double>(whole.lo), scale);
  const double reference = g.to(at::kDouble).square().sum().item<double>();
  CHECK(exact == Approx(reference).epsilon(1e-12));
}
