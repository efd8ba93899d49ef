#include <ditrl/dist/log.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace ditrl::dist {

void setup_logging(const WorldInfo& world, const std::string& out_dir, const std::string& level) {
  std::vector<spdlog::sink_ptr> sinks;
  if (world.rank == 0) {
    sinks.push_back(std::make_shared<spdlog::sinks::stdout_sink_mt>());
  } else {
    auto errors = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    errors->set_level(spdlog::level::warn);
    sinks.push_back(errors);
  }
  if (!out_dir.empty()) {
    const std::filesystem::path dir = std::filesystem::path(out_dir) / "logs";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("cannot create log directory {}: {}", dir.string(), ec.message());
    const std::string file = (dir / fmt::format("rank-{}.log", world.rank)).string();
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      fail("cannot open log file {}: {}", file, e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("ditrl", sinks.begin(), sinks.end());
  logger->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [r{}] [%l] %v", world.rank));
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

namespace {

// "node1 (ranks 0-1), node2 (ranks 2-3)": consecutive ranks of one host
// folded into a range, so a block placement reads at a glance.
std::string layout_text(const std::vector<std::string>& hosts) {
  std::string text;
  for (size_t begin = 0; begin < hosts.size();) {
    size_t end = begin + 1;
    while (end < hosts.size() && hosts[end] == hosts[begin]) ++end;
    text += fmt::format("{}{} (rank{} {}{})", text.empty() ? "" : ", ", hosts[begin], end - begin > 1 ? "s" : "", begin,
                        end - begin > 1 ? fmt::format("-{}", end - 1) : "");
    begin = end;
  }
  std::vector<std::string> distinct = hosts;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  return fmt::format("{} rank(s) on {} host(s): {}", hosts.size(), distinct.size(), text);
}

}  // namespace

void log_placement(const WorldInfo& world, int threads, const std::string& device, MPI_Comm comm) {
  const LocalRankCheck check = check_local_rank(world.local_rank);
  const std::string launcher = check.from_launcher >= 0
                                   ? fmt::format("{}={}", check.launcher_variable, check.from_launcher)
                                   : "no launcher variable";
  spdlog::info("placement: rank {}/{} host {} node-local rank {}/{} ({}) threads {} device {}", world.rank, world.size,
               world.host, world.local_rank, world.local_size, launcher, threads, device);
  if (!check.warning.empty()) spdlog::warn(check.warning);

  // Every rank's host name, fixed width (MPI_MAX_PROCESSOR_NAME covers a hostname).
  std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0'), all;
  std::memcpy(mine.data(), world.host.data(), std::min(world.host.size(), mine.size() - 1));
  if (world.rank == 0) all.resize(mine.size() * static_cast<size_t>(world.size));
  MPI_Gather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, comm);
  if (world.rank != 0) return;
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size; ++r) hosts.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  spdlog::info("layout: {}", layout_text(hosts));
}

std::string memory_text() {
  double rss = 0, peak = 0, anon = 0, file = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    const auto kb = [&](const char* key, double& out) {
      if (line.rfind(key, 0) == 0) out = std::stod(line.substr(std::strlen(key))) * 1024.0;  // "VmRSS:  1234 kB"
    };
    kb("VmRSS:", rss);
    kb("VmHWM:", peak);
    kb("RssAnon:", anon);
    kb("RssFile:", file);
  }
  return fmt::format("RSS {:.3f} GB (anonymous {:.3f}, files {:.3f}), peak {:.3f} GB", rss / 1e9, anon / 1e9,
                     file / 1e9, peak / 1e9);
}

}  // namespace ditrl::dist
