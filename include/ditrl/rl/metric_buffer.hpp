#pragma once

// Scalar training metrics accumulated over an optimizer step's micro-batches
// and reduced across the data-parallel ranks (docs/algorithms.md §7):
// - MEAN: a float64 (sum, count) per key and leaf (the micro-batch's place in
//   the window's canonical order, rl/loss_window.hpp); reduce gives every
//   rank every leaf's (sum, count), adds them over the leaves in leaf order
//   and reports sum / count (item-weighted; absent when no rank counted any
//   item), so the value does not depend on which rank ran which micro-batch;
// - MAX: a float64 running max, all-reduced with MAX (absent if never set);
// - REPLICATED: a value every rank holds identically, reported as is.
// The schema (key -> reduction) is fixed at construction so every rank packs
// the same layout; reduce() checks that the ranks' schemas agree.

#include <ditrl/dist/communicator.hpp>

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace ditrl::rl {

enum class MetricReduce { Mean, Max, Replicated };

using MetricSchema = std::map<std::string, MetricReduce>;

class MetricBuffer {
 public:
  // Accumulators live on `device` (the communicator's: CPU for MPI, CUDA for
  // NCCL) so tensor totals are added without a host sync. `leaves`: the
  // optimizer window's micro-batches over all ranks.
  MetricBuffer(MetricSchema schema, c10::Device device, int64_t leaves = 1);

  // The leaf the next MEAN emissions belong to.
  void set_leaf(int64_t leaf);

  void emit_mean(const std::string& key, const at::Tensor& total, double count);
  void emit_mean(const std::string& key, double total, double count);
  void emit_max(const std::string& key, const at::Tensor& value);
  void emit_max(const std::string& key, double value);
  void emit_replicated(const std::string& key, double value);

  // Collective over `comm`: every rank of the group calls it with the same schema.
  std::map<std::string, double> reduce(dist::Communicator& comm) const;
  // The same without a communicator: this rank's values alone.
  std::map<std::string, double> local() const;
  // Starts the next optimizer step.
  void clear();

  const MetricSchema& schema() const { return schema_; }

 private:
  MetricSchema schema_;
  c10::Device device_;
  // [leaves, #MEAN keys] float64, schema (sorted key) order; -0.0 where
  // nothing was emitted: the identity of addition, so the cross-rank sum of a
  // leaf only one rank filled is that rank's value, bit for bit.
  at::Tensor sums_;
  at::Tensor counts_;
  int64_t leaf_ = 0;
  at::Tensor maxes_;  // [#MAX keys] float64, -inf = never set
  std::map<std::string, double> replicated_;
  std::map<std::string, int64_t> slot_;  // key -> index within its reduction's tensor

  int64_t slot(const std::string& key, MetricReduce expected) const;
  // sums, counts: [leaves, #MEAN keys], added over the leaves here.
  std::map<std::string, double> unpack(const at::Tensor& sums, const at::Tensor& counts, const at::Tensor& maxes) const;
};

}  // namespace ditrl::rl
