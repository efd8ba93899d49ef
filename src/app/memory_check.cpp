#include <ditrl/app/memory_check.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/shard/layout.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace ditrl::app {

namespace {

std::string gb(int64_t bytes) {
  return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9);
}

// A cgroup file's byte count; empty for "max" (no limit) or no file.
std::optional<int64_t> read_bytes(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "key value" lines (memory.stat, /proc/meminfo with its "kB" units dropped).
std::map<std::string, int64_t> read_fields(const std::string& path) {
  std::map<std::string, int64_t> fields;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    int64_t value = 0;
    if (words >> key >> value) fields[key] = value;
  }
  return fields;
}

// What the process's memory cgroup has left: its limit less what it holds,
// not counting page cache (reclaimed under the limit before any OOM).
std::optional<MemoryBudget> cgroup_budget() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    // "0::/path" (v2), "N:memory:/path" or "N:cpu,memory:/path" (v1).
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") + path;
    const std::string limit_file = dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes");
    const std::optional<int64_t> limit = read_bytes(limit_file);
    const std::optional<int64_t> usage = read_bytes(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"));
    if (!limit || !usage || *limit >= (int64_t{1} << 62)) continue;  // v1 writes "no limit" as ~2^63
    const std::map<std::string, int64_t> stat = read_fields(dir + "/memory.stat");
    const auto cache = stat.find(v2 ? "file" : "total_cache");
    const int64_t held = *usage - (cache == stat.end() ? 0 : std::min(cache->second, *usage));
    return MemoryBudget{*limit - held, fmt::format("{}: {} less {} held", limit_file, gb(*limit), gb(held))};
  }
  return std::nullopt;
}

std::optional<MemoryBudget> device_memory_budget(c10::Device device) {
  const int64_t free = dist::free_device_bytes(device);
  if (free < 0) return std::nullopt;
  return MemoryBudget{free, fmt::format("cudaMemGetInfo on {}", device.str())};
}

}  // namespace

std::optional<MemoryBudget> host_memory_budget() {
  std::optional<MemoryBudget> budget;
  const std::map<std::string, int64_t> meminfo = read_fields("/proc/meminfo");
  if (const auto it = meminfo.find("MemAvailable:"); it != meminfo.end())
    budget = MemoryBudget{it->second * 1024, "MemAvailable in /proc/meminfo"};
  if (const std::optional<MemoryBudget> cgroup = cgroup_budget(); cgroup && (!budget || cgroup->bytes < budget->bytes))
    budget = cgroup;
  return budget;
}

void check_plan_fits(const config::Config& c, const MemoryPlan& plan, const MemoryShare& share, bool device) {
  const auto on = [&](int64_t host_peak) { return device ? plan.on_device(host_peak) : host_peak; };
  const int64_t need = on(plan.peak());
  if (need <= share.bytes) return;
  fail(
      "{}: the run needs about {} per rank (`ditrl plan`'s predicted peak{}: load {}, rollout {}, training {}) but {}; "
      "lower train.micro_batch or rollout.microgroup or the latent grid, keep parallel.recompute = true, use "
      "precision.attention = \"flash\" or more ranks, or set run.check_memory = false to start anyway",
      c.source, gb(need), device ? " on the GPU" : "", gb(on(plan.load_peak())), gb(on(plan.rollout_peak())),
      gb(on(plan.training_peak())), share.description);
}

void check_memory_fits(const config::Config& c, dist::Runtime& runtime) {
  if (!c.run.check_memory) return;
  const c10::Device device = runtime.device();
  const std::optional<MemoryBudget> budget = device.is_cuda() ? device_memory_budget(device) : host_memory_budget();
  const int sharing = device.is_cuda() ? 1 : std::max(runtime.world().local_size, 1);
  const int64_t mine = budget ? budget->bytes / sharing : std::numeric_limits<int64_t>::max();
  at::Tensor least = at::full({1}, static_cast<double>(mine), at::kDouble);
  runtime.host().all_reduce(least, dist::ReduceOp::Min);
  const auto bytes = static_cast<int64_t>(least.item<double>());
  if (bytes == std::numeric_limits<int64_t>::max()) return;
  std::string description = fmt::format("a rank on another node has {} (its share of that node's memory)", gb(bytes));
  if (budget && mine == bytes)
    description = device.is_cuda() ? fmt::format("the GPU has {} free ({})", gb(bytes), budget->source)
                                   : fmt::format("this node has {} available for its {} rank(s), {} each ({})",
                                                 gb(budget->bytes), sharing, gb(bytes), budget->source);
  const std::shared_ptr<models::Family> family = plan_family(c);
  const shard::Layout layout =
      shard::build_layout(*family, family->wrap_units(), compiled_plan(c, *family), runtime.world().size);
  check_plan_fits(c, memory_plan(c, *family, layout), {bytes, description}, device.is_cuda());
}

}  // namespace ditrl::app
