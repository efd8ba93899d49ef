// Metric-row timing, the progress line, peak RSS and the status file of a training run.

#include <ditrl/app/progress.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace ditrl::app {

void StepTimes::record(std::map<std::string, double>& row, double gather, double reduce_scatter) {
  row["perf/forward_backward_seconds"] = forward_backward.seconds();
  row["perf/forward_seconds"] = forward.seconds();
  row["perf/backward_seconds"] = backward.seconds();
  row["perf/gather_seconds"] = gather;
  row["perf/reduce_scatter_seconds"] = reduce_scatter;
  row["perf/optimizer_seconds"] = optimizer.seconds();
}

// The log-prob difference at the first step, before any update, is the
// rollout/train parity figure (0 when both forwards agree); later steps
// include the updates of the steps before them.
std::string progress_line(int64_t rollout_id, int64_t total, const std::map<std::string, double>& first,
                          const std::map<std::string, double>& last, size_t steps, double seconds, double eta) {
  auto get = [](const std::map<std::string, double>& row, const char* key) {
    auto it = row.find(key);
    return it == row.end() ? std::nan("") : it->second;
  };
  std::string lp_diff;  // GRPO only: NFT and SFT have no rollout log-prob
  if (first.count("train/log_prob_mean_abs_diff"))
    lp_diff = steps > 1
                  ? fmt::format("  lp_diff@step0 {:.3g} (last {:.3g})", get(first, "train/log_prob_mean_abs_diff"),
                                get(last, "train/log_prob_mean_abs_diff"))
                  : fmt::format("  lp_diff@step0 {:.3g}", get(first, "train/log_prob_mean_abs_diff"));
  return fmt::format(
      "rollout {}/{}  reward {:.4f} +- {:.4f}  loss {:.4g}{}  grad_norm {:.4g}  {:.2f} s/rollout  ETA {:.0f} s",
      rollout_id + 1, total, get(last, "rollout/reward/raw_mean"), get(last, "rollout/reward/raw_std"),
      get(last, "train/loss"), lp_diff, get(last, "train/grad_norm"), seconds, eta);
}

double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // "VmHWM:  1234 kB"
  return std::nan("");
}

void write_status(const std::string& out_dir, const std::string& status) {
  const std::filesystem::path path = std::filesystem::path(out_dir) / "status";
  const std::string tmp = path.string() + ".tmp";
  std::ofstream out(tmp);
  out << status << "\n";
  out.close();  // a full disk fails here; an empty status must not replace the last one
  if (!out) {
    const int error = errno;
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    fail_write(error, fmt::format("cannot write {}", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("cannot rename {} to {}: {}", tmp, path.string(), ec.message());
}

}  // namespace ditrl::app
