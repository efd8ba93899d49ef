#pragma once

// What the peer benchmarks (peer_forward.cpp, peer_forward_ltx.cpp) share:
// the Python peer process, the alternating timing of the two sides, and the
// machine facts their results files record.

#include <ditrl/app/host_malloc.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <boost/json.hpp>

#include <CLI/CLI.hpp>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace peer {

struct Timing {
  std::vector<double> step_seconds, losses, minor_faults;
};

inline long minor_faults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// `steps` timed calls of step(), which runs one training step and returns its loss.
template <class Step>
Timing timed_steps(int steps, const Step& step) {
  Timing timing;
  for (int i = 0; i < steps; ++i) {
    const long faults = minor_faults();
    const auto start = std::chrono::steady_clock::now();
    timing.losses.push_back(step());
    timing.step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    timing.minor_faults.push_back(static_cast<double>(minor_faults() - faults));
  }
  return timing;
}

// `steps` timed training steps of `model`: loss() runs the forward, then
// backward and one optimizer step (gradients dropped first, as
// zero_grad(set_to_none=True) does on the Python side).
template <class Loss>
Timing train_steps(torch::nn::Module& model, torch::optim::Optimizer& optimizer, int steps, const Loss& loss) {
  return timed_steps(steps, [&] {
    for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
    const at::Tensor value = loss();
    value.backward();
    optimizer.step();
    return value.item<double>();
  });
}

// glibc's malloc returns freed big blocks to the kernel (mmap threshold,
// heap trimming), so a process whose big temporaries overlap in time pays
// page faults on every allocation. Python keeps the previous step's tensors
// alive longer than C++ does; the "tuned" mode raises both thresholds on
// both sides to show how much of the gap is that rather than the framework.
constexpr int kMmapThreshold = 32 << 20;  // where glibc's dynamic threshold stops
constexpr int kTrimThreshold = 1 << 30;

// The Python peer as a child process answering "<n>" with n timed steps.
class PythonPeer {
 public:
  // tuned: the peer runs with kMmapThreshold / kTrimThreshold.
  PythonPeer(std::vector<std::string> argv, bool tuned) {
    if (tuned)
      argv.insert(argv.begin(), {"/usr/bin/env", fmt::format("MALLOC_MMAP_THRESHOLD_={}", kMmapThreshold),
                                 fmt::format("MALLOC_TRIM_THRESHOLD_={}", kTrimThreshold)});
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    hello = read();
  }
  ~PythonPeer() {
    fclose(to_);  // EOF ends the peer's loop
    fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  PythonPeer(const PythonPeer&) = delete;
  PythonPeer& operator=(const PythonPeer&) = delete;

  Timing run(int steps) {
    fprintf(to_, "%d\n", steps);
    fflush(to_);
    const boost::json::value doc = read();
    Timing timing;
    for (const auto& v : doc.at("step_seconds").as_array()) timing.step_seconds.push_back(v.to_number<double>());
    for (const auto& v : doc.at("losses").as_array()) timing.losses.push_back(v.to_number<double>());
    for (const auto& v : doc.at("minor_faults").as_array()) timing.minor_faults.push_back(v.to_number<double>());
    return timing;
  }

  boost::json::value hello;

 private:
  boost::json::value read() {
    char* line = nullptr;
    size_t size = 0;
    const ssize_t n = getline(&line, &size, from_);
    const std::string text = n > 0 ? std::string(line, static_cast<size_t>(n)) : std::string();
    free(line);
    if (text.empty()) throw std::runtime_error("the python peer exited (see its stderr above)");
    return boost::json::parse(text);
  }

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

// Both sides' timed steps and their relative loss gaps at the first and the
// last step.
struct Comparison {
  Timing ours, peer;
  double first_gap = 0, last_gap = 0;
};

inline void append(Timing& all, const Timing& more) {
  all.step_seconds.insert(all.step_seconds.end(), more.step_seconds.begin(), more.step_seconds.end());
  all.losses.insert(all.losses.end(), more.losses.begin(), more.losses.end());
  all.minor_faults.insert(all.minor_faults.end(), more.minor_faults.begin(), more.minor_faults.end());
}

// Warm-up, then alternating rounds: both sides see the same background load.
template <class Trainer>
Comparison alternate(Trainer& ours, PythonPeer& peer, int warmup, int rounds, int steps_per_round) {
  if (peer.hello.at("params").to_number<int64_t>() != ours.params)
    throw std::runtime_error("the two models have different parameter counts");
  const auto gap = [](double a, double b) { return std::abs(a - b) / std::abs(b); };
  Comparison c;
  c.first_gap = gap(ours.run(warmup).losses.front(), peer.run(warmup).losses.front());
  for (int r = 0; r < rounds; ++r) {
    append(c.ours, ours.run(steps_per_round));
    append(c.peer, peer.run(steps_per_round));
  }
  c.last_gap = gap(c.ours.losses.back(), c.peer.losses.back());
  return c;
}

// What a results row reports of a Comparison.
struct Summary {
  size_t steps = 0;
  double ours_ms = 0, peer_ms = 0, ours_min_ms = 0, peer_min_ms = 0, ours_faults = 0, peer_faults = 0;
  double first_gap = 0, last_gap = 0;
};

inline Summary summarize(const Comparison& c) {
  const auto min_ms = [](const Timing& t) {
    return *std::min_element(t.step_seconds.begin(), t.step_seconds.end()) * 1e3;
  };
  return {c.ours.step_seconds.size(),
          median(c.ours.step_seconds) * 1e3,
          median(c.peer.step_seconds) * 1e3,
          min_ms(c.ours),
          min_ms(c.peer),
          median(c.ours.minor_faults),
          median(c.peer.minor_faults),
          c.first_gap,
          c.last_gap};
}

// The table cells from "timed steps" to "rel. loss gap first / last step".
inline std::string cells(const Summary& s) {
  return fmt::format("{} | {:.2f} | {:.2f} | **{:.2f}x** | {:.2f} / {:.2f} | {:.0f} / {:.0f} | {:.1e} / {:.1e}",
                     s.steps, s.ours_ms, s.peer_ms, s.peer_ms / s.ours_ms, s.ours_min_ms, s.peer_min_ms, s.ours_faults,
                     s.peer_faults, s.first_gap, s.last_gap);
}

inline std::string speed(const Summary& s) {
  return fmt::format("ditrl {:.2f} ms, python {:.2f} ms, speedup {:.2f}x", s.ours_ms, s.peer_ms, s.peer_ms / s.ours_ms);
}

// The command-line options both peer drivers take; `name` names the results
// file (benchmarks/results/<name>.md) and the scratch directory.
struct Options {
  explicit Options(const std::string& name)
      : out((std::filesystem::path(DITRL_BENCHMARKS_DIR) / "results" / (name + ".md")).string()),
        work((std::filesystem::temp_directory_path() / ("ditrl_" + name)).string()) {}

  void add_to(CLI::App& app) {
    app.add_option("--threads", thread_counts, "intra-op thread counts (both sides use the same)");
    app.add_option("--python", python, "Python interpreter with torch");
    app.add_option("--out", out, "results markdown");
    app.add_option("--work", work, "directory for the shared weights/inputs files");
    app.add_option("--tiny-rounds", tiny_rounds, "alternating rounds (10 steps each side) of the tiny configs");
    app.add_option("--big-rounds", big_rounds, "alternating rounds (1 step each side) of the ~100M configs");
    app.add_flag("--skip-tuned", skip_tuned, "only the default malloc settings");
  }

  // Thread counts ascending, each once (call after parsing).
  void sort_threads() {
    std::sort(thread_counts.begin(), thread_counts.end());
    thread_counts.erase(std::unique(thread_counts.begin(), thread_counts.end()), thread_counts.end());
  }

  std::vector<int> thread_counts = {1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  std::string python = DITRL_PYTHON;
  std::string out, work;
  int tiny_rounds = 10, big_rounds = 4;
  bool skip_tuned = false;
};

// The `malloc` column's modes as this build runs them (mallopt is a no-op
// under tcmalloc, so `tuned` then reaches the Python side only).
inline std::string malloc_modes_text() {
  if (ditrl::app::tcmalloc_in_use())
    return fmt::format(
        "`malloc` = `default`: each side's malloc as it ships (ditrl: {}; Python: glibc's defaults); `tuned`: "
        "M_MMAP_THRESHOLD = 32 MiB and M_TRIM_THRESHOLD = 1 GiB on the Python side (tcmalloc ignores them).",
        ditrl::app::host_malloc_name());
  return "`malloc` = `default`: each side's malloc as it ships (ditrl: glibc with its 32 MiB mmap / 64 MiB trim "
         "thresholds; Python: glibc's defaults); `tuned`: M_MMAP_THRESHOLD = 32 MiB and M_TRIM_THRESHOLD = 1 GiB on "
         "both sides.";
}

// fn(tuned) with each side's malloc as it ships (ditrl's own thresholds,
// app/host_malloc.hpp, in this process; glibc's defaults in the Python
// child), then (unless skip_tuned) with the tuned thresholds on both sides:
// default first, as mallopt() cannot be undone in a process.
template <class Fn>
void for_each_malloc_mode(bool skip_tuned, const Fn& fn) {
  ditrl::app::keep_freed_host_memory();
  fn(false);
  if (skip_tuned) return;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kTrimThreshold);
  fn(true);
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// The 1-minute load average: how busy the (possibly shared) machine was.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "unknown" : one;
}

// `python -c "import <module>; print(<module>.__version__)"`.
inline std::string python_module_version(const std::string& python, const std::string& module) {
  FILE* pipe = popen((python + " -c 'import " + module + "; print(" + module + ".__version__)' 2>&1").c_str(), "r");
  char buffer[256] = {0};
  const size_t n = pipe ? fread(buffer, 1, sizeof buffer - 1, pipe) : 0;
  if (pipe) pclose(pipe);
  std::string v(buffer, n);
  v.erase(v.find_last_not_of(" \n") + 1);
  return v;
}

inline std::string python_torch_version(const std::string& python) {
  return python_module_version(python, "torch");
}

inline std::string blas_library() {
  std::error_code ec;
  const std::string blas =
      std::filesystem::read_symlink("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", ec).string();
  return blas.empty() ? "unknown" : blas;
}

inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return date;
}

inline std::string command_line(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  return command;
}

}  // namespace peer
