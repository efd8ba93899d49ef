#pragma once

// OUT/report.html: the run on one page that opens from disk, no server, no
// script from elsewhere: its identity (name, deck, commit, device, ranks),
// its throughput, a curve per metric (inline SVG) and the preview samples
// by rollout (relative links into OUT/samples). Rank 0 writes it at each
// checkpoint and at the end, under a temporary name and renamed.

#include <ditrl/app/progress.hpp>
#include <ditrl/io/metrics.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::app {

struct ReportIdentity {
  std::string name, deck_path, deck_text, commit, device;
  int ranks = 1;
  int threads = 1;
  int64_t num_rollouts = 0;
};

class RunReport {
 public:
  // `earlier`: the rows of metrics.h5 a resumed run starts from.
  RunReport(std::string out_dir, ReportIdentity identity, const io::MetricsTable& earlier);

  void add(const MetricRow& row);
  // `rollouts_done` of num_rollouts, `seconds`: this job's training time for `job_rollouts` of them.
  void write(int64_t rollouts_done, int64_t job_rollouts, double seconds) const;

 private:
  std::string out_dir_;
  ReportIdentity identity_;
  std::vector<int64_t> steps_;
  std::map<std::string, std::vector<double>> series_;  // aligned with steps_; NaN where a row lacked the key
};

// The page's HTML (write() writes it; the tests read it).
std::string report_html(const ReportIdentity& identity, const std::vector<int64_t>& steps,
                        const std::map<std::string, std::vector<double>>& series, const std::string& samples_index,
                        int64_t rollouts_done, int64_t job_rollouts, double seconds);

}  // namespace ditrl::app
