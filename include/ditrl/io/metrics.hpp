#pragma once

// OUT/metrics.h5: one row per optimizer step. /metrics/step holds the global
// optimizer step of each row; /metrics/<name> (names may contain '/', e.g.
// train/loss -> /metrics/train/loss) is an extendible float64 series aligned
// with it. A metric missing from a row is NaN there. The root carries the
// deck text, build info, the CPU that ran it (cpu_kernel_identity) and the
// device rank 0 computed on (dist::device_identity: it says so when a CPU-only
// build left a machine's GPUs unused).
// Written by rank 0 only.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::io {

class MetricsWriter {
 public:
  // Creates the file, or reopens it for a resumed run and drops the rows
  // from `first_step` on (they belong to the interrupted run and are
  // recomputed), so a resumed run's file equals an uninterrupted one. A file
  // that cannot be reopened is moved aside (PATH.damaged) with a warning and
  // a new one started; so is a missing one (warned): training goes on.
  MetricsWriter(const std::string& path, const std::string& deck_text, const std::string& device, bool resume,
                int64_t first_step);
  void write(int64_t step, const std::map<std::string, double>& values);
  const std::string& path() const { return path_; }

 private:
  void reopen(int64_t first_step);

  std::string path_;
  int64_t rows_ = 0;
  std::vector<std::string> known_;  // every series in the file
};

struct MetricsTable {
  std::vector<int64_t> steps;
  std::map<std::string, std::vector<double>> series;
  std::string cpu;  // the file's `cpu` attribute; empty in files written before it existed
};

// What picks this machine's bf16 CPU kernels (oneDNN chooses them by
// instruction set, and deterministic mode cannot pin it): the CPU model name,
// the instruction-set flags oneDNN dispatches on, ONEDNN_MAX_CPU_ISA when
// set, precision.cpu_half_gemm when it is not this CPU's "auto" choice, and
// precision.cpu_fp32_gemm when it runs oneDNN's fp32 matmul.
// Two runs with the same identity run the same kernels.
std::string cpu_kernel_identity();

// Reads every series of a metrics file (error naming the file if it is not one).
MetricsTable read_metrics(const std::string& path);

// The same for a file a running job may be writing (`ditrl status` on a login
// node): its bytes are copied while its size and modification time stay the
// same and read from memory, so the reader takes no HDF5 file lock (which
// would make the writer's next open fail) and never writes. A copy caught
// between the writer's updates fails to parse or has series of unequal
// lengths; it is taken again, up to `tries` times, then the last error is
// raised. The deck the writer stored is returned in `deck` when given.
MetricsTable read_metrics_while_written(const std::string& path, int tries = 20, std::string* deck = nullptr);

}  // namespace ditrl::io
