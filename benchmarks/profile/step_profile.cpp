// Where a training step of ditrl's goes, per op family, and how close its
// GEMMs come to the machine's measured GEMM ceiling.
//
// One rank trains a family's ~100M (or, with --case tiny, tiny) peer_forward config (benchmarks/
// peer/peer_cases.hpp) through shard::ShardedParams (what `ditrl train` runs);
// after warm-up steps, `--steps` steps run under LibTorch's profiler (CPU
// activities, FLOP counts), and each op's self time goes to one op family
// (op_families.hpp). The ceiling: the best of a few large
// single-thread shapes of ditrl's linear in the step's dtype, timed here in the same
// process right after the steps. malloc runs with ditrl's thresholds
// (app/host_malloc.hpp), as under `ditrl train`. With --peer, diffusers' own
// class for the family trains on the same files under PyTorch's profiler
// (benchmarks/peer/peer_profile.py, the step of benchmarks/peer/peer_diffusers.py) and
// its events go through the same attribution: a second column per family.
//
//   bench_step_profile [--family sd3] [--case big|tiny|tiny2] [--compute fp32|bf16] [--attention math|flash]
//                      [--no-recompute] [--fused-adamw] [--steps 2] [--out FILE.md] [--trace FILE.json]
//                      [--peer [--python PY]]

#include <ditrl/app/host_malloc.hpp>
#include <ditrl/app/named_option.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "peer/peer_cases.hpp"
#include "peer/peer_harness.hpp"
#include "profile/op_families.hpp"
#include "profile/step_profile_report.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>

namespace {

using namespace ditrl;
using namespace step_profile;
namespace prof = torch::autograd::profiler;

constexpr double kLr = 1e-4;

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--family", s.family, "sd3 | wan | qwen_image (its ~100M peer_forward config)");
  app.add_option("--case", s.case_name,
                 "big: the ~100M config | tiny / tiny2: the family's tiny preset, peer_forward's batch 1 / 2 case")
      ->check(CLI::IsMember({"big", "tiny", "tiny2"}));
  app::add_named_option(app, "--compute", s.compute, precision::kDtypeNames, {at::kFloat, at::kBFloat16},
                        "fp32 | bf16");
  app::add_named_option(app, "--attention", s.attention, models::kAttentionNames,
                        {models::AttentionBackend::Math, models::AttentionBackend::Flash}, "math | flash");
  app.add_flag("--no-recompute", s.no_recompute, "every block keeps its forward's graph (parallel.recompute = false)");
  app.add_flag("--fused-adamw", s.fused_adamw, "LibTorch's fused AdamW kernel (train.fused_adamw = true)");
  app.add_option("--steps", s.steps, "profiled steps");
  app.add_option("--warmup", s.warmup, "steps before profiling");
  app.add_option("--work", s.work, "directory for the weights / inputs files");
  app.add_option("--out", s.out, "append the markdown section to this file (default: stdout only)");
  app.add_option(
      "--trace", s.trace,
      "also write the profiled steps as a Chrome trace with input shapes (benchmarks/profile/trace_ops.py reads it)");
  app.add_flag("--peer", s.with_peer,
               "also profile diffusers' class for the family on the same files (benchmarks/peer/peer_profile.py)");
  app.add_option("--python", s.python, "Python interpreter with torch and diffusers (for --peer)");
}

// The case --case names among the family's peer_forward cases.
peer::Case chosen_case(const Settings& s) {
  const std::vector<peer::Case> cases = peer::kFamilies.at(s.family).cases(1, 1);
  return s.case_name == "tiny" ? cases.front() : s.case_name == "tiny2" ? cases.at(1) : cases.back();
}

// The family trained as `ditrl train` trains it on one rank, on the case's
// weights and inputs files: forward, MSE loss, backward, AdamW (the latter
// inside kOptimizerScope, which attributes it to the optimizer family).
class TrainingStep {
 public:
  TrainingStep(const Settings& s, const std::string& dir, dist::Communicator& comm)
      : family_(peer::make_family(s.family, dir + "/config.json", s.compute, s.attention)) {
    models::load_weights(*family_, io::Checkpoint(dir + "/weights.safetensors"));
    for (const auto& p : family_->parameters()) params += p.numel();
    shard::ShardOptions options;
    options.recompute = !s.no_recompute;
    options.adamw.fused = s.fused_adamw;
    sharded_ = std::make_unique<shard::ShardedParams>(*family_, family_->wrap_units(),
                                                      peer::training_plan(*family_, s.compute), comm, options);
    ctx_.runner = sharded_.get();
    const io::SafetensorsFile file(dir + "/inputs.safetensors");
    x_ = file.get("latents"), t_ = file.get("timesteps"), sigma_ = file.get("sigmas"), target_ = file.get("target");
    for (const models::CondSpec& spec : family_->cond_spec()) cond_.tensors[spec.name] = file.get("cond." + spec.name);
  }

  void run() {
    sharded_->zero_grad();
    sharded_->begin_step();
    at::mse_loss(family_->noise_pred(x_, t_, sigma_, cond_, ctx_).to(at::kFloat), target_).backward();
    sharded_->finish_backward();
    RECORD_FUNCTION(kOptimizerScope, std::vector<c10::IValue>());
    sharded_->adamw_step(kLr);
  }

  int64_t params = 0;

 private:
  std::shared_ptr<models::Family> family_;
  std::unique_ptr<shard::ShardedParams> sharded_;
  models::ForwardContext ctx_;
  at::Tensor x_, t_, sigma_, target_;
  models::Cond cond_;
};

// The profiler counts no FLOPs for oneDNN's linear (models/onednn_linear.hpp):
// 2 x input elements x output features, from the recorded shapes.
uint64_t op_flops(const prof::KinetoEvent& e) {
  if (e.name() != "mkldnn::_linear_pointwise" || !e.hasShapes()) return e.flops();
  const auto shapes = e.shapes();
  if (shapes.size() < 2 || shapes[1].size() != 2) return e.flops();
  int64_t input = 1;
  for (int64_t d : shapes[0]) input *= d;
  return static_cast<uint64_t>(2 * input * shapes[1][0]);
}

// `steps` steps under LibTorch's profiler (CPU activities, input shapes, FLOP
// counts); their wall time goes to `seconds`, the trace to `trace` if named.
std::vector<Op> profiled_events(TrainingStep& step, int steps, const std::string& trace, double& seconds) {
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     /*report_input_shapes=*/true, /*profile_memory=*/false,
                                                     /*with_stack=*/false, /*with_flops=*/true);
  const std::set<torch::profiler::impl::ActivityType> activities = {torch::profiler::impl::ActivityType::CPU};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step.run();
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!trace.empty()) result->save(trace);
  std::vector<Op> events;
  for (const prof::KinetoEvent& e : result->events())
    if (e.deviceType() == c10::DeviceType::CPU && e.endNs() > e.startNs())
      events.push_back({e.name(), e.startNs(), e.endNs(), e.startThreadId(), op_flops(e)});
  return events;
}

// Best single-thread GFLOP/s of ditrl's linear (the kernel the step's layers
// run: precision.cpu_half_gemm / cpu_fp32_gemm) over a few large shapes (the
// step's biggest GEMMs are of this size), median of 5 timings each.
double gemm_ceiling_gflops(c10::ScalarType dtype, std::string& shapes) {
  double best = 0;
  const std::vector<std::array<int64_t, 3>> sizes = {{1024, 1024, 1024}, {768, 768, 3072}, {768, 3072, 768}};
  const at::NoGradGuard no_grad;
  for (const auto& [m, k, n] : sizes) {
    const at::Tensor a = at::randn({m, k}).to(dtype), w = at::randn({n, k}).to(dtype);
    models::linear(a, w, at::Tensor());
    std::vector<double> seconds;
    for (int i = 0; i < 5; ++i) {
      const auto start = std::chrono::steady_clock::now();
      models::linear(a, w, at::Tensor());
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double gflops = 2.0 * m * k * n / peer::median(seconds) / 1e9;
    shapes += fmt::format("{}{}x{}x{} {:.1f}", shapes.empty() ? "" : ", ", m, k, n, gflops);
    best = std::max(best, gflops);
  }
  return best;
}

// The file of tcmalloc when this process runs on it (ditrl links it where
// the system has it), else "".
std::string own_tcmalloc() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t path = line.find('/');
    if (path != std::string::npos && line.find("tcmalloc", path) != std::string::npos) return line.substr(path);
  }
  return "";
}

// Everything a command prints on its standard output.
std::string output_of(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start: " + command);
  std::string text;
  std::array<char, 1 << 16> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) text.append(buffer.data(), n);
  if (pclose(pipe) != 0 || text.empty())
    throw std::runtime_error("the peer's profile failed (stderr above): " + command);
  return text;
}

// diffusers' step on the same files, profiled in a Python process
// (benchmarks/peer/peer_profile.py); its events get ditrl's attribution. The peer
// runs on ditrl's malloc: under glibc's, the profiler's own allocations made
// its profiled bf16 steps 1.5-2.4x its unprofiled ones, under tcmalloc 1.1x.
PeerProfile profile_peer(const Settings& s, const std::string& dir) {
  const std::string tcmalloc = own_tcmalloc();
  const boost::json::value doc = boost::json::parse(
      output_of(fmt::format("{}'{}' '{}/peer/peer_profile.py' --family {} --dir '{}' --precision {} --steps {} "
                            "--warmup {} --optimizer-scope {}",
                            tcmalloc.empty() ? "" : "LD_PRELOAD='" + tcmalloc + "' ", s.python, DITRL_BENCHMARKS_DIR,
                            s.family, dir, precision::dtype_name(s.compute), s.steps, s.warmup, kOptimizerScope)));
  std::vector<Op> events;
  for (const boost::json::value& v : doc.at("events").as_array()) {
    const boost::json::array& e = v.as_array();
    const Op op{std::string(e.at(0).as_string()), e.at(1).to_number<uint64_t>(), e.at(2).to_number<uint64_t>(),
                e.at(3).to_number<uint64_t>(), e.at(4).to_number<uint64_t>()};
    if (op.end > op.start) events.push_back(op);
  }
  return {attribute(events, doc.at("seconds").to_number<double>()),
          fmt::format("{}, torch {}, diffusers {}", tcmalloc.empty() ? "glibc's malloc" : "on tcmalloc (LD_PRELOAD)",
                      std::string(doc.at("torch").as_string()), std::string(doc.at("diffusers").as_string()))};
}

// The step profiled, the peer's if asked for, then the GEMM ceiling.
Measured measure(const Settings& s, const std::string& dir, dist::Communicator& comm) {
  TrainingStep step(s, dir, comm);
  for (int i = 0; i < s.warmup; ++i) step.run();
  Measured m;
  m.params = step.params;
  const std::vector<Op> events = profiled_events(step, s.steps, s.trace, m.seconds);
  m.ditrl = attribute(events, m.seconds);
  if (s.with_peer) m.peer = profile_peer(s, dir);
  m.ceiling_gflops = gemm_ceiling_gflops(s.compute, m.ceiling_shapes);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  Settings s;
  CLI::App app{"ditrl's training step per op family, against the measured GEMM ceiling"};
  add_options(app, s);
  CLI11_PARSE(app, argc, argv);
  app::keep_freed_host_memory();
  at::set_num_threads(1);
  const auto comm = dist::make_mpi_communicator();
  if (!peer::kFamilies.count(s.family)) {
    std::cerr << "unknown family '" << s.family << "'\n";
    return 2;
  }
  const peer::Case c = chosen_case(s);
  const std::string dir = s.work + "/" + s.family;
  peer::prepare_case(c, dir);
  const std::string md = report(s, c, measure(s, dir, *comm), peer::command_line(argc, argv));
  std::cout << md;
  if (!s.out.empty()) std::ofstream(s.out, std::ios::app) << md;
  return 0;
}
