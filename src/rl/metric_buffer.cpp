#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/metric_buffer.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ditrl::rl {

namespace {

const char* reduce_name(MetricReduce r) {
  switch (r) {
    case MetricReduce::Mean:
      return "MEAN";
    case MetricReduce::Max:
      return "MAX";
    case MetricReduce::Replicated:
      return "REPLICATED";
  }
  return "?";
}

}  // namespace

MetricBuffer::MetricBuffer(MetricSchema schema, c10::Device device, int64_t leaves)
    : schema_(std::move(schema)), device_(device) {
  if (leaves < 1) fail("metric buffer: {} leaves", leaves);
  int64_t means = 0;
  int64_t maxes = 0;
  for (const auto& [key, op] : schema_) {
    if (op == MetricReduce::Mean) slot_[key] = means++;
    if (op == MetricReduce::Max) slot_[key] = maxes++;
  }
  const auto options = at::TensorOptions().dtype(at::kDouble).device(device_);
  sums_ = at::full({leaves, means}, -0.0, options);
  counts_ = at::full({leaves, means}, -0.0, options);
  maxes_ = at::full({maxes}, -std::numeric_limits<double>::infinity(), options);
}

void MetricBuffer::set_leaf(int64_t leaf) {
  if (leaf < 0 || leaf >= sums_.size(0)) fail("metric buffer: leaf {} outside [0, {})", leaf, sums_.size(0));
  leaf_ = leaf;
}

int64_t MetricBuffer::slot(const std::string& key, MetricReduce expected) const {
  auto it = schema_.find(key);
  if (it == schema_.end()) fail("metric '{}' is not in the metric schema", key);
  if (it->second != expected)
    fail("metric '{}' reduces as {}, not {}", key, reduce_name(it->second), reduce_name(expected));
  return expected == MetricReduce::Replicated ? -1 : slot_.at(key);
}

void MetricBuffer::emit_mean(const std::string& key, const at::Tensor& total, double count) {
  const int64_t i = slot(key, MetricReduce::Mean);
  if (!total.defined() || total.numel() != 1) fail("metric '{}': the total must be a scalar tensor", key);
  sums_[leaf_][i].add_(total.detach().reshape({}).to(device_, at::kDouble));
  counts_[leaf_][i].add_(count);
}

void MetricBuffer::emit_mean(const std::string& key, double total, double count) {
  const int64_t i = slot(key, MetricReduce::Mean);
  sums_[leaf_][i].add_(total);
  counts_[leaf_][i].add_(count);
}

void MetricBuffer::emit_max(const std::string& key, const at::Tensor& value) {
  const int64_t i = slot(key, MetricReduce::Max);
  if (!value.defined() || value.numel() != 1) fail("metric '{}': the value must be a scalar tensor", key);
  maxes_[i].copy_(at::maximum(maxes_[i], value.detach().reshape({}).to(device_, at::kDouble)));
}

void MetricBuffer::emit_max(const std::string& key, double value) {
  const int64_t i = slot(key, MetricReduce::Max);
  maxes_[i].copy_(at::maximum(maxes_[i], at::scalar_tensor(value, maxes_.options())));
}

void MetricBuffer::emit_replicated(const std::string& key, double value) {
  slot(key, MetricReduce::Replicated);
  replicated_[key] = value;
}

void MetricBuffer::clear() {
  sums_.fill_(-0.0);
  counts_.fill_(-0.0);
  maxes_.fill_(-std::numeric_limits<double>::infinity());
  replicated_.clear();
}

std::map<std::string, double> MetricBuffer::unpack(const at::Tensor& sums, const at::Tensor& counts,
                                                   const at::Tensor& maxes) const {
  // The same leaves in the same order on every rank and at every rank count;
  // one device->host copy of sums, counts and maxes together.
  const int64_t n = sums.size(1);
  const at::Tensor all = at::cat({sums.sum(0), counts.sum(0), maxes}).cpu();
  const double* s = all.data_ptr<double>();
  const double* c = s + n;
  const double* m = c + n;
  std::map<std::string, double> out;
  for (const auto& [key, op] : schema_) {
    if (op == MetricReduce::Mean) {
      const int64_t i = slot_.at(key);
      const double count = c[i];
      if (count > 0) out[key] = s[i] / count;  // no rank contributed: not a datapoint
    } else if (op == MetricReduce::Max) {
      const double v = m[slot_.at(key)];
      if (v != -std::numeric_limits<double>::infinity()) out[key] = v;
    }
  }
  for (const auto& [key, value] : replicated_) out[key] = value;
  return out;
}

std::map<std::string, double> MetricBuffer::local() const {
  return unpack(sums_, counts_, maxes_);
}

std::map<std::string, double> MetricBuffer::reduce(dist::Communicator& comm) const {
  // Every rank must pack the same layout: compare a hash of the schema first.
  std::vector<std::string> layout;
  for (const auto& [key, op] : schema_) layout.push_back(key + "=" + reduce_name(op));
  const auto h = static_cast<int64_t>(stable_hash_of(layout));
  at::Tensor check = dist::host_to_device(at::tensor({h, -h}, at::TensorOptions().dtype(at::kLong)), device_);
  comm.all_reduce(check, dist::ReduceOp::Max);
  const at::Tensor seen = check.cpu();
  if (seen.data_ptr<int64_t>()[0] != h || seen.data_ptr<int64_t>()[1] != -h)
    fail("metric reduce: rank {} has a metric schema that differs from another rank's ({} keys here)", comm.rank(),
         schema_.size());

  at::Tensor packed = at::cat({sums_, counts_}, 1).contiguous();
  at::Tensor maxes = maxes_.clone();
  if (packed.numel() > 0) comm.all_reduce(packed, dist::ReduceOp::Sum);
  if (maxes.numel() > 0) comm.all_reduce(maxes, dist::ReduceOp::Max);
  const int64_t n = sums_.size(1);
  return unpack(packed.narrow(1, 0, n), packed.narrow(1, n, n), maxes);
}

}  // namespace ditrl::rl
