#pragma once

// Pairs the tensors of two dumps (io/tensor_dump.hpp) and measures how far
// apart they are: what `ditrl align` reports.
//
// Relative error of a pair (a, b), b the reference:
//   rel = max|a - b| / max|b|, in fp64 over all elements;
//   when max|b| = 0: rel = 0 if a == b everywhere, else +inf;
//   a shape mismatch, or a NaN/inf in a - b (unless the pair is bit-exact),
//   gives +inf.
// A pair is bit-exact when both have the same dtype, shape and bytes (a bf16
// tensor is never bit-exact with an fp32 one, even if the values agree).

#include <ditrl/io/tensor_dump.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::io {

struct TensorComparison {
  bool bit_exact = false;
  double rel = 0;
};

TensorComparison compare_tensors(const at::Tensor& a, const at::Tensor& b);

// Entries of the two dumps with the same key and path, in forward order (A's
// seq, then B's, then key and path); the rest named "<key>/<path>".
struct DumpPairing {
  std::vector<std::pair<DumpEntry, DumpEntry>> pairs;
  std::vector<std::string> only_a, only_b;
};

DumpPairing pair_dump_entries(const std::vector<DumpEntry>& a, const std::vector<DumpEntry>& b);

struct AlignedPair {
  std::string name;  // "<key>/<module>/<tensor>"
  std::string dtype_a, dtype_b;
  TensorComparison comparison;
};

struct AlignmentSummary {
  int64_t pairs = 0;
  int64_t bit_exact = 0;
  int64_t over_threshold = 0;              // rel >= threshold
  double peak = 0;                         // max rel (0 without pairs)
  double median = 0;                       // median rel (mean of the middle two for an even count)
  std::vector<size_t> worst;               // non-bit-exact pairs of largest rel, largest first (ties: forward order)
  std::optional<size_t> first_divergence;  // first pair in forward order that is not bit-exact
};

// `pairs` in forward order.
AlignmentSummary summarize_alignment(const std::vector<AlignedPair>& pairs, double threshold, size_t worst = 10);

}  // namespace ditrl::io
