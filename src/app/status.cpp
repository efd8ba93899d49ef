// `ditrl status RUN_DIR`: what a run has done and whether it is well, read
// from its files without touching them (app/run_status.hpp).

#include <ditrl/app/commands.hpp>
#include <ditrl/app/run_status.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/metrics.hpp>
#include <ditrl/io/out_dir_lock.hpp>

#include <fmt/format.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <regex>
#include <sstream>

namespace ditrl::app {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kTrendRollouts = 10;
constexpr size_t kRateLines = 20;  // the newest progress lines the rate is measured over
constexpr size_t kShownProblems = 5;

std::string trimmed_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text;
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void require_run_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("ditrl status {}: no such folder", dir.string());
  if (!fs::is_directory(dir, ec)) fail("ditrl status {}: not a folder (give a run's run.out_dir)", dir.string());
  for (const char* entry : {"metrics.h5", "metrics.h5.damaged", "status", "checkpoints", "logs", ".lock"})
    if (fs::exists(dir / entry, ec)) return;
  fail(
      "ditrl status {}: not a ditrl run folder: it holds none of metrics.h5, status, checkpoints/, logs/ or .lock "
      "(give the run.out_dir of a `ditrl train` job)",
      dir.string());
}

// The rollouts' first rows: one reward mean per rollout, in order.
std::vector<double> rewards_per_rollout(const io::MetricsTable& m) {
  std::vector<double> rewards;
  const auto epoch = m.series.find("train/epoch");
  const auto reward = m.series.find("rollout/reward/raw_mean");
  if (epoch == m.series.end() || reward == m.series.end()) return rewards;
  for (size_t row = 0; row < m.steps.size(); ++row)
    if (row == 0 || epoch->second[row] != epoch->second[row - 1]) rewards.push_back(reward->second[row]);
  return rewards;
}

double mean(std::vector<double>::const_iterator begin, std::vector<double>::const_iterator end) {
  double sum = 0;
  for (auto it = begin; it != end; ++it) sum += *it;
  return sum / static_cast<double>(end - begin);
}

void read_metrics_part(const fs::path& dir, RunStatus& s, std::string& deck) {
  const fs::path path = dir / "metrics.h5";
  if (!fs::exists(path)) {
    s.metrics_problem =
        fs::exists(dir / "metrics.h5.damaged") ? "absent (a damaged one was moved to metrics.h5.damaged)" : "absent";
    return;
  }
  io::MetricsTable m;
  try {
    m = io::read_metrics_while_written(path.string(), 20, &deck);
  } catch (const Error& e) {
    s.metrics_problem = e.what();
    return;
  }
  if (m.steps.empty()) return;
  s.last_step = m.steps.back();
  if (const auto epoch = m.series.find("train/epoch"); epoch != m.series.end())
    s.rollouts_done = static_cast<int64_t>(epoch->second.back()) + 1;
  if (const auto norm = m.series.find("train/grad_norm"); norm != m.series.end())
    s.skipped_steps =
        std::count_if(norm->second.begin(), norm->second.end(), [](double v) { return !std::isfinite(v); });
  const std::vector<double> rewards = rewards_per_rollout(m);
  if (rewards.empty()) return;
  s.trend_rollouts = std::min<int64_t>(kTrendRollouts, static_cast<int64_t>(rewards.size()));
  s.reward_first = mean(rewards.begin(), rewards.begin() + s.trend_rollouts);
  s.reward_last = mean(rewards.end() - s.trend_rollouts, rewards.end());
}

void read_checkpoint_part(const fs::path& dir, bool verify, RunStatus& s) {
  const io::ResumeCandidates found = io::resume_candidates(dir.string());
  if (found.paths.empty()) return;
  CheckpointStatus& c = s.checkpoint;
  c.path = found.paths.front();
  const std::regex step_file(R"(step-(\d+)\.h5)");
  std::smatch m;
  const std::string name = fs::path(c.path).filename().string();
  if (std::regex_match(name, m, step_file)) c.step = std::stoll(m[1]);
  if (!verify) return;
  try {
    const io::CheckpointMeta meta = io::verify_checkpoint(c.path);
    c.verifies = true;
    c.step = meta.step;
    c.next_rollout = meta.rollout_id;
  } catch (const Error& e) {
    c.verifies = false;
    c.problem = e.what();
  }
}

// run.name and train.num_rollouts of the deck the newest checkpoint (else metrics.h5) stores.
void read_deck_part(const std::string& deck_text, const std::string& source, RunStatus& s) {
  if (deck_text.empty()) return;
  try {
    const config::Config deck = config::parse_deck(deck_text, source);
    s.name = deck.run.name;
    s.num_rollouts = deck.train.num_rollouts;
  } catch (const Error&) {
    // A deck of an older ditrl: the rest of the status stands without it.
  }
}

struct ProgressLine {
  std::time_t time = 0;
  double millis = 0;
  int64_t rollout = 0;
  double seconds = 0;  // the line's own s/rollout
};

// Rank 0's progress lines of the newest job in the log (a job appends to it).
std::vector<ProgressLine> newest_job_progress(const fs::path& log) {
  const std::regex progress(
      R"(^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3})\] \[r0\] \[info\] rollout (\d+)/\d+ .* ([0-9.]+) s/rollout)");
  std::vector<ProgressLine> lines;
  std::smatch m;
  for (const std::string& line : lines_of(log)) {
    if (line.find("] [info] ditrl train ") != std::string::npos) lines.clear();
    if (!std::regex_search(line, m, progress)) continue;
    std::tm tm{};
    std::istringstream(m[1].str()) >> std::get_time(&tm, "%Y-%m-%d %H:%M:%S");
    tm.tm_isdst = -1;
    ProgressLine p{std::mktime(&tm), std::stod(m[2]), std::stoll(m[3]), std::stod(m[4])};
    if (!lines.empty() && p.rollout <= lines.back().rollout) lines.clear();
    lines.push_back(p);
  }
  return lines;
}

void read_rate_part(const fs::path& dir, RunStatus& s) {
  std::vector<ProgressLine> lines = newest_job_progress(dir / "logs" / "rank-0.log");
  if (lines.empty()) return;
  if (lines.size() > kRateLines) lines.erase(lines.begin(), lines.end() - kRateLines);
  const ProgressLine& a = lines.front();
  const ProgressLine& b = lines.back();
  const double seconds = std::difftime(b.time, a.time) + (b.millis - a.millis) / 1000.0;
  if (lines.size() > 1 && seconds > 0)
    s.rollouts_per_hour = static_cast<double>(b.rollout - a.rollout) * 3600.0 / seconds;
  else if (b.seconds > 0)
    s.rollouts_per_hour = 3600.0 / b.seconds;
  if (s.rollouts_per_hour && s.num_rollouts > 0 && s.state != "complete")
    s.eta_hours = static_cast<double>(std::max<int64_t>(0, s.num_rollouts - s.rollouts_done)) / *s.rollouts_per_hour;
}

void read_log_problems(const fs::path& dir, RunStatus& s) {
  std::error_code ec;
  if (!fs::is_directory(dir / "logs", ec)) return;
  std::vector<std::string> problems;
  for (const auto& entry : fs::directory_iterator(dir / "logs", ec)) {
    if (entry.path().extension() != ".log") continue;
    for (const std::string& line : lines_of(entry.path()))
      if (line.find("] [warning] ") != std::string::npos || line.find("] [error] ") != std::string::npos ||
          line.find("] [critical] ") != std::string::npos)
        problems.push_back(line);
  }
  std::stable_sort(problems.begin(), problems.end());  // lines start with their time stamp
  s.log_problem_count = static_cast<int64_t>(problems.size());
  if (problems.size() > kShownProblems) problems.erase(problems.begin(), problems.end() - kShownProblems);
  s.log_problems = problems;
}

// The lock's holder still runs when it is a live ditrl process of this host.
bool holder_runs_here(const io::LockHolder& holder, const std::string& host) {
  if (holder.host != host) return false;
  const std::string cmdline = trimmed_text(fs::path("/proc") / std::to_string(holder.pid) / "cmdline");
  return cmdline.find("ditrl") != std::string::npos;
}

// complete | preempted: the status the last job wrote, no job having started
// since; running: the lock's job is alive on this host; stopped: a job started
// after the last status (or wrote none) and is gone (killed, crashed, ended by
// the watchdog); unknown: that job ran on another host.
std::string run_state(const fs::path& dir, const RunStatus& s) {
  std::error_code ec;
  const bool locked = fs::exists(dir / ".lock", ec);
  const std::optional<io::LockHolder> holder = io::parse_lock_holder(s.lock_holder);
  const std::string host = io::this_host();
  if (locked && holder && holder_runs_here(*holder, host)) return "running";
  const bool newer_job =
      locked && (s.status.empty() || fs::last_write_time(dir / ".lock", ec) > fs::last_write_time(dir / "status", ec));
  if (!newer_job) return s.status.empty() ? "not started" : s.status;
  if (holder && holder->host != host)
    return fmt::format("unknown (its newest job ran on host {}: run `ditrl status` there or ask the scheduler)",
                       holder->host);
  return "stopped";
}

std::string number(const std::optional<double>& v, const char* format = "{:.4g}") {
  return v ? fmt::format(fmt::runtime(format), *v) : "-";
}

}  // namespace

RunStatus read_run_status(const std::string& out_dir, bool verify) {
  const fs::path dir(out_dir);
  require_run_folder(dir);
  RunStatus s;
  s.out_dir = out_dir;
  if (fs::exists(dir / "status")) s.status = trimmed_text(dir / "status");
  if (fs::exists(dir / ".lock")) s.lock_holder = trimmed_text(dir / ".lock");
  std::string metrics_deck;
  read_metrics_part(dir, s, metrics_deck);
  read_checkpoint_part(dir, verify, s);
  // The newest job's deck: its checkpoint's (a resume may change keys), else the one metrics.h5 began with.
  const std::string checkpoint_deck = s.checkpoint.path.empty() ? "" : io::checkpoint_deck(s.checkpoint.path);
  if (!checkpoint_deck.empty())
    read_deck_part(checkpoint_deck, s.checkpoint.path + " (its stored deck)", s);
  else
    read_deck_part(metrics_deck, (dir / "metrics.h5").string() + " (its stored deck)", s);
  s.state = run_state(dir, s);
  read_rate_part(dir, s);
  read_log_problems(dir, s);
  return s;
}

std::string status_text(const RunStatus& s) {
  std::string out = fmt::format("run          {} ({})\n", s.name.empty() ? "?" : s.name, s.out_dir);
  out += fmt::format("state        {}{}\n", s.state,
                     s.status.empty() ? " (no status file)" : fmt::format(" (status file: {})", s.status));
  if (!s.lock_holder.empty()) out += fmt::format("newest job   {}\n", s.lock_holder);
  if (!s.metrics_problem.empty()) out += fmt::format("metrics.h5   {}\n", s.metrics_problem);
  const std::string total = s.num_rollouts > 0 ? fmt::format("/{}", s.num_rollouts) : "";
  if (s.last_step >= 0)
    out += fmt::format("progress     rollout {}{} done, optimizer step {}\n", s.rollouts_done, total, s.last_step);
  if (s.reward_first)
    out += fmt::format("reward       {} (mean of the first {} rollouts) -> {} (the last {})\n", number(s.reward_first),
                       s.trend_rollouts, number(s.reward_last), s.trend_rollouts);
  if (s.rollouts_per_hour)
    out += fmt::format(
        "speed        {} rollouts/h{}\n", number(s.rollouts_per_hour, "{:.1f}"),
        s.eta_hours ? fmt::format(", ETA {} h to rollout {}", number(s.eta_hours, "{:.2f}"), s.num_rollouts) : "");
  const CheckpointStatus& c = s.checkpoint;
  if (c.path.empty()) {
    out += "checkpoint   none\n";
  } else {
    const std::string verdict = !c.verifies   ? "not verified (--no-verify)"
                                : *c.verifies ? fmt::format("verifies (resumes at rollout {})", c.next_rollout)
                                              : "DOES NOT VERIFY: " + c.problem;
    out += fmt::format("checkpoint   {} (step {}): {}\n", c.path, c.step, verdict);
  }
  out += fmt::format("skipped      {} optimizer step(s) with a non-finite loss or gradient\n", s.skipped_steps);
  if (s.log_problem_count == 0) {
    out += "logs         no warning or error\n";
  } else {
    out += fmt::format("logs         {} warning/error line(s); the newest:\n", s.log_problem_count);
    for (const std::string& line : s.log_problems) out += "  " + line + "\n";
  }
  return out;
}

std::string status_json(const RunStatus& s) {
  auto optional = [](const std::optional<double>& v) {
    return v ? boost::json::value(*v) : boost::json::value(nullptr);
  };
  boost::json::object checkpoint{{"path", s.checkpoint.path},
                                 {"step", s.checkpoint.step},
                                 {"next_rollout", s.checkpoint.next_rollout},
                                 {"problem", s.checkpoint.problem}};
  checkpoint["verifies"] = s.checkpoint.verifies ? boost::json::value(*s.checkpoint.verifies) : nullptr;
  if (s.checkpoint.path.empty()) checkpoint = {};
  boost::json::array problems;
  for (const std::string& line : s.log_problems) problems.emplace_back(line);
  const boost::json::object o{{"out_dir", s.out_dir},
                              {"name", s.name},
                              {"state", s.state},
                              {"status_file", s.status},
                              {"preempted", s.status == "preempted" && s.state == "preempted"},
                              {"newest_job", s.lock_holder},
                              {"metrics_problem", s.metrics_problem},
                              {"num_rollouts", s.num_rollouts},
                              {"rollouts_done", s.rollouts_done},
                              {"last_step", s.last_step},
                              {"trend_rollouts", s.trend_rollouts},
                              {"reward_first", optional(s.reward_first)},
                              {"reward_last", optional(s.reward_last)},
                              {"rollouts_per_hour", optional(s.rollouts_per_hour)},
                              {"eta_hours", optional(s.eta_hours)},
                              {"skipped_steps", s.skipped_steps},
                              {"checkpoint", s.checkpoint.path.empty() ? boost::json::value(nullptr) : checkpoint},
                              {"log_problem_count", s.log_problem_count},
                              {"log_problems", problems}};
  return boost::json::serialize(o) + "\n";
}

void add_status_command(CLI::App& app, Command& selected) {
  struct Cli {
    std::string out_dir;
    bool json = false;
    bool no_verify = false;
  };
  auto cli = std::make_shared<Cli>();
  CLI::App* sub = app.add_subcommand(
      "status",
      "A run at a glance from its folder, safe while its job trains: progress, reward trend, speed, ETA, "
      "checkpoint, skipped steps, log warnings");
  sub->add_option("run_dir", cli->out_dir, "The run's folder (run.out_dir)")->required();
  sub->add_flag("--json", cli->json, "Print one JSON object (for scripts)");
  sub->add_flag("--no-verify", cli->no_verify,
                "Do not read the newest checkpoint to check its SHA-256 manifest (a full fine-tune's is large)");
  sub->callback([cli, &selected] {
    selected = [cli] {
      const RunStatus s = read_run_status(cli->out_dir, !cli->no_verify);
      std::cout << (cli->json ? status_json(s) : status_text(s));
      return 0;
    };
  });
}

}  // namespace ditrl::app
