// `ditrl align`'s arithmetic against closed forms: relative error, bit
// exactness, pairing, median, peak, worst list, first divergence.
#include <ditrl/io/dump_alignment.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

using namespace ditrl;
using io::AlignedPair;
using io::compare_tensors;
using io::DumpEntry;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

at::Tensor f32(std::vector<float> values) {
  return at::tensor(values, at::kFloat);
}

AlignedPair pair(const std::string& name, double rel, bool exact) {
  return {name, "fp32", "fp32", {exact, rel}};
}

}  // namespace

TEST_CASE("align: relative error is max|a-b| / max|b| with the zero reference handled", "[align]") {
  const at::Tensor b = f32({1.0f, -4.0f, 2.0f});
  const auto same = compare_tensors(b.clone(), b);
  CHECK(same.bit_exact);
  CHECK(same.rel == 0.0);

  // One element off by 0.5 where max|b| = 4: rel = 0.5 / 4 exactly.
  const auto off = compare_tensors(f32({1.0f, -4.0f, 2.5f}), b);
  CHECK_FALSE(off.bit_exact);
  CHECK(off.rel == 0.125);
  // The reference is B: swapping the operands changes the denominator (max|a| = 4.5).
  CHECK(compare_tensors(f32({1.0f, -4.5f, 2.0f}), b).rel == 0.125);
  CHECK(compare_tensors(b, f32({1.0f, -4.5f, 2.0f})).rel == 0.5 / 4.5);

  const at::Tensor zero = at::zeros({3}, at::kFloat);
  CHECK(compare_tensors(zero.clone(), zero).rel == 0.0);
  CHECK(compare_tensors(f32({0.0f, 1e-30f, 0.0f}), zero).rel == kInf);
  // -0.0 and +0.0 differ in bits but not in value: not bit-exact, rel 0.
  const auto signed_zero = compare_tensors(f32({-0.0f, 0.0f, 0.0f}), zero);
  CHECK_FALSE(signed_zero.bit_exact);
  CHECK(signed_zero.rel == 0.0);
}

TEST_CASE("align: dtype / shape and non-finite values", "[align]") {
  const at::Tensor b = f32({0.5f, 1.0f, -2.0f, 3.0f});
  // bf16 represents these exactly: equal values, different bytes.
  const auto bf16 = compare_tensors(b.to(at::kBFloat16), b);
  CHECK_FALSE(bf16.bit_exact);
  CHECK(bf16.rel == 0.0);
  // fp32(1/3) = 11184811 / 2^25 rounds to bf16 171/512 (8 significant bits); the difference and both
  // values are exact in fp64, so rel is their quotient, rounded once (about 2^-9).
  const at::Tensor third = f32({1.0f / 3});
  const double f = 11184811.0 / (1 << 25);
  REQUIRE(static_cast<double>(third.item<float>()) == f);
  CHECK(compare_tensors(third.to(at::kBFloat16), third).rel == (171.0 / 512 - f) / f);
  CHECK(compare_tensors(third.to(at::kBFloat16), third).rel == Approx(std::pow(2.0, -9)).epsilon(1e-4));

  CHECK(compare_tensors(b.view({2, 2}), b).rel == kInf);
  CHECK_FALSE(compare_tensors(b.view({2, 2}), b).bit_exact);
  const at::Tensor nan = f32({std::nanf(""), 1.0f});
  CHECK(compare_tensors(nan.clone(), nan).bit_exact);  // same bits
  CHECK(compare_tensors(nan, f32({0.0f, 1.0f})).rel == kInf);
  CHECK(compare_tensors(f32({std::numeric_limits<float>::infinity(), 1.0f}), f32({1.0f, 1.0f})).rel == kInf);
}

TEST_CASE("align: pairing by key and path / in forward order / with unpaired names", "[align]") {
  const std::vector<DumpEntry> a = {{"r0_s0_t1", "sde/mean", 5},
                                    {"r0_s0_t1", "pos_embed/out0", 0},
                                    {"r0_s0_t1", "proj_out/out0", 4},
                                    {"r0_s1_t1", "pos_embed/out0", 6}};
  const std::vector<DumpEntry> b = {{"r0_s0_t1", "pos_embed/out0", 10},
                                    {"r0_s0_t1", "sde/mean", 2},
                                    {"r0_s0_t1", "proj_out/out0", 1},
                                    {"r0_s0_t2", "pos_embed/out0", 11}};
  const io::DumpPairing p = io::pair_dump_entries(a, b);
  REQUIRE(p.pairs.size() == 3);
  CHECK(p.pairs[0].first.path == "pos_embed/out0");  // A's seq decides the order
  CHECK(p.pairs[1].first.path == "proj_out/out0");
  CHECK(p.pairs[2].first.path == "sde/mean");
  CHECK(p.pairs[2].second.seq == 2);
  CHECK(p.only_a == std::vector<std::string>{"r0_s1_t1/pos_embed/out0"});
  CHECK(p.only_b == std::vector<std::string>{"r0_s0_t2/pos_embed/out0"});
}

TEST_CASE("align: summary counts / median / peak / worst ten and first divergence", "[align]") {
  std::vector<AlignedPair> pairs = {pair("k/a/out0", 0, true), pair("k/b/out0", 0.2, false),
                                    pair("k/c/out0", 0.05, false), pair("k/d/out0", 0, true),
                                    pair("k/e/out0", kInf, false)};
  io::AlignmentSummary s = io::summarize_alignment(pairs, 5e-2);
  CHECK(s.pairs == 5);
  CHECK(s.bit_exact == 2);
  CHECK(s.over_threshold == 3);  // >= threshold: 0.05, 0.2, inf
  CHECK(s.peak == kInf);
  CHECK(s.median == 0.05);  // sorted 0, 0, 0.05, 0.2, inf
  REQUIRE(s.first_divergence);
  CHECK(*s.first_divergence == 1);
  CHECK(s.worst == std::vector<size_t>{4, 1, 2});  // bit-exact pairs are never "worst"

  pairs.pop_back();
  s = io::summarize_alignment(pairs, 0.3, 2);
  CHECK(s.median == 0.025);  // even count: mean of the middle two (0 and 0.05)
  CHECK(s.peak == 0.2);
  CHECK(s.over_threshold == 0);
  CHECK(s.worst == std::vector<size_t>{1, 2});

  const io::AlignmentSummary exact = io::summarize_alignment({pair("k/a/out0", 0, true)}, 5e-2);
  CHECK(exact.bit_exact == 1);
  CHECK_FALSE(exact.first_divergence);
  CHECK(exact.worst.empty());
  CHECK(io::summarize_alignment({}, 5e-2).pairs == 0);
}
