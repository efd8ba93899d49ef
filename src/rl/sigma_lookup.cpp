#include <ditrl/error.hpp>
#include <ditrl/rl/sigma_lookup.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace ditrl::rl {

namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Maps the float's bit pattern onto a line where consecutive floats are consecutive integers.
int64_t ordered(float f) {
  const auto b = static_cast<int32_t>(bits_of(f));
  return b >= 0 ? int64_t{b} : int64_t{std::numeric_limits<int32_t>::min()} - b;
}

std::string describe(float f) {
  return fmt::format("{} (fp32 bits 0x{:08X})", f, bits_of(f));
}

// The nearest snapshot entries below and above `value`, with their ULP distance.
std::string nearest_entries(const float* entries, int64_t count, float value) {
  int64_t below = -1;
  int64_t above = -1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t d = ulp_distance(value, entries[i]);
    if (d < 0 && (below < 0 || d > ulp_distance(value, entries[below]))) below = i;
    if (d > 0 && (above < 0 || d < ulp_distance(value, entries[above]))) above = i;
  }
  std::vector<std::string> parts;
  for (int64_t i : {below, above})
    if (i >= 0)
      parts.push_back(fmt::format("[{}] = {}, {:+} ULP", i, describe(entries[i]), ulp_distance(value, entries[i])));
  if (parts.empty()) return "none (the value is not finite)";
  return fmt::format("{}", fmt::join(parts, "; "));
}

at::Tensor checked_queries(const at::Tensor& q, const char* what) {
  if (!q.defined() || q.dim() != 1 || q.scalar_type() != at::kFloat)
    fail("sigma lookup: {} must be a 1-D fp32 tensor (the snapshot's own values), got {}", what,
         q.defined() ? fmt::format("{} of shape {}", c10::toString(q.scalar_type()), fmt::join(q.sizes(), "x"))
                     : "undefined");
  return q.to(at::kCPU).contiguous();
}

// Index of the entry exactly equal to each query among the first `count`
// entries of `domain`; a miss or an ambiguous match is an error.
SnapshotEntries lookup(const diffusion::Schedule& snapshot, const at::Tensor& queries, const at::Tensor& domain,
                       int64_t count, const char* what) {
  snapshot.check("sigma lookup snapshot");
  const at::Tensor q = checked_queries(queries, what);
  const float* entries = domain.data_ptr<float>();
  const float* values = q.data_ptr<float>();
  const int64_t n = q.size(0);
  at::Tensor indices = at::empty({n}, at::kLong);
  int64_t* idx = indices.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) {
    idx[b] = -1;
    for (int64_t i = 0; i < count; ++i) {
      if (entries[i] != values[b]) continue;
      if (idx[b] >= 0)
        fail(
            "sigma lookup: {} {} matches snapshot entries [{}] and [{}]; a schedule with duplicate values is "
            "ambiguous",
            what, describe(values[b]), idx[b], i);
      idx[b] = i;
    }
    if (idx[b] < 0)
      fail(
          "sigma lookup: {} {} (query {} of {}) was not found in the rollout's snapshot of {} entries; nearest: {}. "
          "Values "
          "are matched exactly, never rescaled between t and sigma: the pair must carry a value the rollout "
          "recorded",
          what, describe(values[b]), b, n, count, nearest_entries(entries, count, values[b]));
  }
  const auto device = queries.device();
  return SnapshotEntries{indices.to(device), snapshot.timesteps.index_select(0, indices).to(device),
                         snapshot.sigmas.index_select(0, indices).to(device),
                         snapshot.sigmas.index_select(0, indices + 1).to(device)};
}

void require_same_array(const at::Tensor& a, const at::Tensor& b, const char* name, int64_t reference_sample,
                        int64_t sample) {
  if (a.sizes() != b.sizes())
    fail(
        "sample {} carries {} of shape {}, sample {} of shape {}: all samples of a batch must share the rollout's "
        "snapshot",
        sample, name, fmt::join(b.sizes(), "x"), reference_sample, fmt::join(a.sizes(), "x"));
  const float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i)
    if (bits_of(x[i]) != bits_of(y[i]))
      fail(
          "sample {} carries different scheduler {} than sample {}: entry [{}] is {} vs {} ({:+} ULP); all samples "
          "of a batch must share bitwise-equal snapshots",
          sample, name, reference_sample, i, describe(y[i]), describe(x[i]), ulp_distance(x[i], y[i]));
}

}  // namespace

int64_t ulp_distance(float a, float b) {
  return ordered(b) - ordered(a);
}

SnapshotEntries lookup_sigmas(const diffusion::Schedule& snapshot, const at::Tensor& timesteps) {
  return lookup(snapshot, timesteps, snapshot.timesteps, snapshot.steps(), "timestep");
}

SnapshotEntries lookup_timesteps(const diffusion::Schedule& snapshot, const at::Tensor& sigmas) {
  return lookup(snapshot, sigmas, snapshot.sigmas, snapshot.steps(), "sigma");
}

void require_same_snapshot(const diffusion::Schedule& reference, int64_t reference_sample,
                           const diffusion::Schedule& other, int64_t sample) {
  reference.check(fmt::format("snapshot of sample {}", reference_sample));
  other.check(fmt::format("snapshot of sample {}", sample));
  require_same_array(reference.timesteps, other.timesteps, "timesteps", reference_sample, sample);
  require_same_array(reference.sigmas, other.sigmas, "sigmas", reference_sample, sample);
}

}  // namespace ditrl::rl
