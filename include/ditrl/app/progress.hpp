#pragma once

// What a training run reports besides its checkpoints: metric rows (one per
// optimizer step, for OUT/metrics.h5), the per-step timing breakdown, the
// progress line rank 0 prints per rollout, the peak resident set, and the
// OUT/status file a job script reads.

#include <ditrl/dist/phase_timer.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace ditrl::app {

struct MetricRow {
  int64_t step = 0;
  std::map<std::string, double> values;
};

// Seconds of one optimizer step's parts (perf/* metrics): wall time on the
// CPU, device time on a GPU (dist/phase_timer.hpp).
struct StepTimes {
  explicit StepTimes(c10::Device device)
      : forward(device), backward(device), forward_backward(device), optimizer(device) {}

  dist::PhaseTimer forward, backward, forward_backward, optimizer;

  // perf/{forward_backward,forward,backward,optimizer,gather,reduce_scatter}_seconds.
  void record(std::map<std::string, double>& row, double gather, double reduce_scatter);
};

// `first` is the rollout's first optimizer step, `last` its last (of `steps`).
std::string progress_line(int64_t rollout_id, int64_t total, const std::map<std::string, double>& first,
                          const std::map<std::string, double>& last, size_t steps, double seconds, double eta);

// Peak resident set of this process (VmHWM), for the per-rank memory metric.
double peak_rss_bytes();

// OUT/status: "complete" or "preempted", replaced atomically.
void write_status(const std::string& out_dir, const std::string& status);

}  // namespace ditrl::app
