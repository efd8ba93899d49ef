// Where each rank runs: host, local rank, device, NUMA nodes and CPU set.

#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/dist/device.hpp>

#include <fmt/format.h>
#include <sched.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace ditrl::app::preflight {

namespace {

std::set<int> cpu_list(const std::string& text) {  // "0-3,8,10-11"
  std::set<int> cpus;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    int first = 0, last = 0;
    const int n = std::sscanf(part.c_str(), "%d-%d", &first, &last);
    if (n < 1) continue;
    for (int c = first; c <= (n == 2 ? last : first); ++c) cpus.insert(c);
  }
  return cpus;
}

std::string ranges(const std::set<int>& values) {
  std::string out;
  for (auto it = values.begin(); it != values.end();) {
    const int first = *it;
    int last = first;
    while (++it != values.end() && *it == last + 1) ++last;
    out += fmt::format("{}{}", out.empty() ? "" : ",",
                       first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last));
  }
  return out;
}

std::set<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  return cpus;
}

// The NUMA nodes whose CPUs this rank may run on (/sys/devices/system/node).
std::string numa_nodes(const std::set<int>& cpus) {
  std::set<int> nodes;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/sys/devices/system/node", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    std::ifstream list(it->path() / "cpulist");
    std::string text;
    std::getline(list, text);
    for (const int c : cpu_list(text))
      if (cpus.count(c)) nodes.insert(std::stoi(name.substr(4)));
  }
  return nodes.empty() ? "unknown (no /sys/devices/system/node)" : ranges(nodes);
}
}  // namespace

Local placement(const dist::Runtime& runtime) {
  const dist::WorldInfo& w = runtime.world();
  const std::set<int> cpus = allowed_cpus();
  Local out;
  out.text = fmt::format("local rank {}/{}, device {}, data {}, NUMA node(s) {}, CPUs {} ({})", w.local_rank,
                         w.local_size, dist::device_identity(runtime.device(), runtime.options().device),
                         dist::to_string(runtime.data_backend()), numa_nodes(cpus), ranges(cpus), cpus.size());
  if (const dist::LocalRankCheck check = dist::check_local_rank(w.local_rank); !check.warning.empty()) {
    out.passed = false;
    out.text += "; " + check.warning;
  }
  return out;
}

}  // namespace ditrl::app::preflight
