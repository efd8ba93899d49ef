#include <ditrl/app/commands.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/standard.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <iostream>

namespace ditrl::app {

namespace {

struct StandardOptions {
  std::string run_dir;
  std::string file;
  bool with_tolerances = false;  // check: apply the tolerances even on the recording CPU
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
  const io::ToleranceMode mode = o.with_tolerances ? io::ToleranceMode::Always : io::ToleranceMode::OtherCpu;
  const bool tolerant = io::tolerances_apply(standard, run, mode);
  // Why the tolerances do or do not apply, both on success and on failure.
  const std::string where =
      standard.tolerance.empty() ? ""
      : !tolerant                ? "; on the recording CPU, so its tolerances do not apply"
      : o.with_tolerances        ? "; tolerances applied (--with-tolerances)"
                                 : fmt::format("; tolerances applied: recorded on \"{}\", this run on \"{}\"",
                                               standard.cpu.empty() ? "an unrecorded CPU" : standard.cpu,
                                               run.cpu.empty() ? "an unrecorded CPU" : run.cpu);
  const std::vector<std::string> problems = io::check_standard(standard, run, mode);
  if (!problems.empty()) {
    std::string message = o.run_dir + " does not meet the standard " + o.file + where + ":";
    for (const std::string& p : problems) message += "\n  " + p;
    throw Error(message);
  }
  std::cout << "standard met: " << standard.metrics.size() << " metrics x " << run.steps.size() << " steps ("
            << (tolerant ? standard.tolerance.size() : 0) << " with a tolerance, the rest bitwise" << where << ")\n";
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
    if (!is_record)
      leaf->add_flag("--with-tolerances", options->with_tolerances,
                     "Apply the standard's tolerances as on another CPU model (they never apply on the recording one)");
    leaf->callback([options, &selected, is_record] {
      selected = [options, is_record] { return is_record ? record(*options) : check(*options); };
    });
  }
}

}  // namespace ditrl::app
