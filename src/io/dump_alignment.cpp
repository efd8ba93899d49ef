#include <ditrl/io/dump_alignment.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace ditrl::io {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.numel()) * ca.element_size()) == 0;
}

std::string full_name(const DumpEntry& e) {
  return e.key + "/" + e.path;
}

}  // namespace

TensorComparison compare_tensors(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.to(at::kCPU), cb = b.to(at::kCPU);
  if (same_bytes(ca, cb)) return {true, 0.0};
  if (ca.sizes() != cb.sizes()) return {false, kInf};
  if (ca.numel() == 0) return {false, 0.0};  // two empty tensors of different dtypes
  const at::Tensor da = ca.to(at::kDouble), db = cb.to(at::kDouble);
  const double diff = (da - db).abs().max().item<double>();
  const double scale = db.abs().max().item<double>();
  if (std::isnan(diff) || std::isinf(diff)) return {false, kInf};
  if (scale == 0) return {false, diff == 0 ? 0.0 : kInf};
  return {false, diff / scale};
}

DumpPairing pair_dump_entries(const std::vector<DumpEntry>& a, const std::vector<DumpEntry>& b) {
  std::map<std::string, const DumpEntry*> in_b;
  for (const DumpEntry& e : b) in_b[full_name(e)] = &e;
  DumpPairing out;
  std::set<std::string> paired;
  for (const DumpEntry& e : a) {
    const auto it = in_b.find(full_name(e));
    if (it == in_b.end()) {
      out.only_a.push_back(full_name(e));
    } else {
      out.pairs.emplace_back(e, *it->second);
      paired.insert(it->first);
    }
  }
  for (const DumpEntry& e : b)
    if (!paired.count(full_name(e))) out.only_b.push_back(full_name(e));
  // Without a seq (-1) a tensor sorts before the ordered ones, by name.
  std::stable_sort(out.pairs.begin(), out.pairs.end(), [](const auto& x, const auto& y) {
    return std::make_tuple(x.first.seq, x.second.seq, full_name(x.first)) <
           std::make_tuple(y.first.seq, y.second.seq, full_name(y.first));
  });
  std::sort(out.only_a.begin(), out.only_a.end());
  std::sort(out.only_b.begin(), out.only_b.end());
  return out;
}

AlignmentSummary summarize_alignment(const std::vector<AlignedPair>& pairs, double threshold, size_t worst) {
  AlignmentSummary s;
  s.pairs = static_cast<int64_t>(pairs.size());
  std::vector<double> rel;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const TensorComparison& c = pairs[i].comparison;
    rel.push_back(c.rel);
    s.bit_exact += c.bit_exact ? 1 : 0;
    s.over_threshold += c.rel >= threshold ? 1 : 0;
    if (!c.bit_exact && !s.first_divergence) s.first_divergence = i;
  }
  if (rel.empty()) return s;
  s.peak = *std::max_element(rel.begin(), rel.end());
  std::vector<double> sorted = rel;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (!pairs[i].comparison.bit_exact) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&rel](size_t x, size_t y) { return rel[x] > rel[y]; });
  order.resize(std::min(worst, order.size()));
  s.worst = order;
  return s;
}

}  // namespace ditrl::io
