#include "gpu/kernel_profile.hpp"

#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace gpu_step {

namespace {

namespace prof = torch::autograd::profiler;
constexpr int kSteps = 2;

// A CUDA kernel's op family, from its name (cuBLAS: nvjet / *gemm* / cutlass;
// flash and memory-efficient attention: flash / fmha; torch's fused AdamW).
std::string kernel_family(const std::string& name) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kFamilies = {
      {"attention", {"flash", "fmha", "attention"}},
      {"GEMM", {"nvjet", "gemm", "Gemm", "cutlass", "xmma"}},
      {"optimizer (fused AdamW)", {"Adam"}},
      {"norms", {"norm", "Norm", "Moments", "GammaBeta"}},
      {"copies, casts, fills", {"copy", "Copy", "Memcpy", "Memset", "fill", "CatArray"}},
      {"reductions", {"reduce_kernel"}},
  };
  for (const auto& [family, needles] : kFamilies)
    for (const std::string& needle : needles)
      if (name.find(needle) != std::string::npos) return family;
  return "elementwise and other";
}

// Device seconds per step, by family and by kernel, and the spans they ran in.
struct DeviceTime {
  std::map<std::string, double> by_family, by_kernel;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
};

DeviceTime device_time(const prof::ProfilerResult& result) {
  const std::set<uint8_t> device_work = {static_cast<uint8_t>(libkineto::ActivityType::CONCURRENT_KERNEL),
                                         static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMCPY),
                                         static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMSET)};
  DeviceTime t;
  for (const prof::KinetoEvent& e : result.events()) {
    if (!device_work.count(e.activityType()) || e.endNs() <= e.startNs()) continue;
    const double seconds = static_cast<double>(e.durationNs()) * 1e-9 / kSteps;
    t.by_family[kernel_family(e.name())] += seconds;
    t.by_kernel[e.name()] += seconds;
    t.spans.emplace_back(e.startNs(), e.endNs());
  }
  return t;
}

// Busy seconds per step: the union of the device spans (streams overlap).
double busy_seconds(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  double busy = 0;
  uint64_t open = 0, close = 0;
  for (const auto& [b, e] : spans) {
    if (b > close) {
      busy += static_cast<double>(close - open);
      open = b;
    }
    close = std::max(close, e);
  }
  return (busy + static_cast<double>(close - open)) * 1e-9 / kSteps;
}

std::vector<std::pair<std::string, double>> longest_first(const std::map<std::string, double>& m) {
  std::vector<std::pair<std::string, double>> out(m.begin(), m.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string report(const DeviceTime& t, double wall, const std::string& title) {
  const double busy = busy_seconds(t.spans);
  std::string md = fmt::format(
      "### {}: where the GPU's time goes\n\n{} profiled steps: {:.1f} ms of wall time per step, the GPU busy {:.1f} "
      "ms of it ({:.0f}%; the rest it waits for the host). Device time per step by kernel family (streams may "
      "overlap):\n\n| kernel family | ms per step | share of the wall time |\n|---|---|---|\n",
      title, kSteps, wall * 1e3, busy * 1e3, 100 * busy / wall);
  for (const auto& [family, seconds] : longest_first(t.by_family))
    md += fmt::format("| {} | {:.2f} | {:.1f}% |\n", family, seconds * 1e3, 100 * seconds / wall);
  md += "\nLongest kernels (ms per step):\n\n";
  const auto kernels = longest_first(t.by_kernel);
  for (size_t i = 0; i < std::min<size_t>(10, kernels.size()); ++i)
    md += fmt::format("- {:.2f} `{}`\n", kernels[i].second * 1e3, kernels[i].first.substr(0, 120));
  return md + "\n";
}

}  // namespace

// Where no device work runs the GPU waits for the host (a launch-bound step).
std::string profile_steps(const std::function<void()>& step, const std::string& title) {
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) step();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kSteps;
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  return report(device_time(*result), wall, title);
}

}  // namespace gpu_step
