// Memory per rank against `ditrl plan`'s prediction.

#include <ditrl/app/memory_check.hpp>
#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/dist/device.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace ditrl::app::preflight {

void check_memory(Report& report, const dist::Runtime& runtime, const std::optional<MemoryPlan>& plan) {
  if (!plan) {
    report.skip("memory vs plan", "no deck: nothing to predict");
    return;
  }
  const dist::WorldInfo& w = runtime.world();
  Local mine;
  int64_t predicted = 0, available = 0;
  if (runtime.device().is_cuda()) {
    const int sharing = std::max(1, w.local_size / std::max(1, dist::visible_gpus()));
    predicted = plan->device_peak();
    available = dist::free_device_bytes(runtime.device()) / sharing;
    mine.text = fmt::format("{} GPU: predicted peak {:.3f} GB, free {:.3f} GB (shared by {} rank(s))",
                            runtime.device().str(), predicted / 1e9, available * sharing / 1e9, sharing);
  } else {
    predicted = plan->peak();
    // The budget `ditrl train` checks its plan against: MemAvailable, or a tighter cgroup limit.
    const std::optional<MemoryBudget> budget = host_memory_budget();
    available = budget ? budget->bytes / std::max(1, w.local_size) : -1;
    mine.text = fmt::format("host: predicted peak {:.3f} GB, available {:.3f} GB per rank ({} / {})", predicted / 1e9,
                            available / 1e9, budget ? budget->source : "no budget known", w.local_size);
  }
  mine.passed = available >= predicted;
  report.add("memory vs plan", mine,
             fmt::format("ditrl plan's peak per rank {:.3f} GB against what each rank has", predicted / 1e9));
}

}  // namespace ditrl::app::preflight
