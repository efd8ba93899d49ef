#include <ditrl/app/commands.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/standard.hpp>

#include <filesystem>
#include <iostream>

namespace ditrl::app {

namespace {

struct StandardOptions {
  std::string run_dir;
  std::string file;
};

std::string metrics_path(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / "metrics.h5").string();
  if (!std::filesystem::exists(path)) fail("{}: no metrics.h5 in this run directory", run_dir);
  return path;
}

int record(const StandardOptions& o) {
  const std::string path = metrics_path(o.run_dir);
  const io::MetricsTable run = io::read_metrics(path);
  io::Standard standard = io::make_standard(run, io::h5::File::open(path).string_attr("deck"));
  // Re-recording keeps the tolerances (and their reasons) already agreed on.
  if (std::filesystem::exists(o.file)) standard.tolerance = io::read_standard(o.file).tolerance;
  io::write_standard(o.file, standard);
  std::cout << "recorded " << standard.metrics.size() << " metrics x " << run.steps.size() << " steps from "
            << path << " into " << o.file << "\n";
  return 0;
}

int check(const StandardOptions& o) {
  const io::Standard standard = io::read_standard(o.file);
  const io::MetricsTable run = io::read_metrics(metrics_path(o.run_dir));
  const std::vector<std::string> problems = io::check_standard(standard, run);
  if (!problems.empty()) {
    std::string message = o.run_dir + " does not meet the standard " + o.file + ":";
    for (const std::string& p : problems) message += "\n  " + p;
    throw Error(message);
  }
  std::cout << "standard met: " << standard.metrics.size() << " metrics x " << run.steps.size() << " steps ("
            << standard.tolerance.size() << " with a tolerance, the rest bitwise)\n";
  return 0;
}

}  // namespace

void add_standard_command(CLI::App& app, Command& selected) {
  auto options = std::make_shared<StandardOptions>();
  CLI::App* sub = app.add_subcommand("standard", "Record or check an e2e standard (metric series of a run)");
  sub->require_subcommand(1);
  for (const char* verb : {"record", "check"}) {
    CLI::App* leaf = sub->add_subcommand(verb, std::string(verb) == "record"
                                                   ? "Write RUN_DIR's metric series to FILE.json"
                                                   : "Compare RUN_DIR's metric series with FILE.json");
    leaf->add_option("run_dir", options->run_dir, "Run directory holding metrics.h5")->required();
    leaf->add_option("file", options->file, "Standard JSON file")->required();
    const bool is_record = std::string(verb) == "record";
    leaf->callback([options, &selected, is_record] {
      selected = [options, is_record] { return is_record ? record(*options) : check(*options); };
    });
  }
}

}  // namespace ditrl::app
