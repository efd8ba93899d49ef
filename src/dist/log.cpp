#include <ditrl/dist/log.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <filesystem>

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

}  // namespace ditrl::dist
