// Metric-row timing, the progress line, peak RSS and the status file of a training run.

#include <ditrl/app/progress.hpp>

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace ditrl::app {

void StepTimes::record(std::map<std::string, double>& row, double gather, double reduce_scatter) const {
  row["perf/forward_backward_seconds"] = forward_backward;
  row["perf/forward_seconds"] = forward;
  row["perf/backward_seconds"] = backward;
  row["perf/gather_seconds"] = gather;
  row["perf/reduce_scatter_seconds"] = reduce_scatter;
  row["perf/optimizer_seconds"] = optimizer;
}

std::string progress_line(int64_t rollout_id, int64_t total, const std::map<std::string, double>& row, double seconds,
                          double eta) {
  auto get = [&row](const char* key) {
    auto it = row.find(key);
    return it == row.end() ? std::nan("") : it->second;
  };
  return fmt::format(
      "rollout {}/{}  reward {:.4f} +- {:.4f}  loss {:.4g}  lp_diff {:.3g}  grad_norm {:.4g}  {:.2f} s/rollout  "
      "ETA {:.0f} s",
      rollout_id + 1, total, get("rollout/reward/raw_mean"), get("rollout/reward/raw_std"), get("train/loss"),
      get("train/log_prob_mean_abs_diff"), get("train/grad_norm"), seconds, eta);
}

double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // "VmHWM:  1234 kB"
  return std::nan("");
}

void write_status(const std::string& out_dir, const std::string& status) {
  const std::filesystem::path path = std::filesystem::path(out_dir) / "status";
  std::ofstream(path.string() + ".tmp") << status << "\n";
  std::filesystem::rename(path.string() + ".tmp", path);
}

}  // namespace ditrl::app
