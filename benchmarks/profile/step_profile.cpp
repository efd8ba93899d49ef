// Where a training step of ditrl's goes, per op family, and how close its
// GEMMs come to the machine's measured GEMM ceiling.
//
// One rank trains a family's ~100M (or, with --case tiny, tiny) peer_forward config (benchmarks/
// peer_cases.hpp) through shard::ShardedParams (what `ditrl train` runs);
// after warm-up steps, `--steps` steps run under LibTorch's profiler (CPU
// activities, FLOP counts). Each op's self time (its duration minus its
// children's, per thread) goes to one family by the op's name: GEMM (mm,
// addmm, bmm, convolutions), attention (softmax and its backward, masked
// fill), copies (copy_, _to_copy, cat, clone, ...), allocation (empty*),
// norms / elementwise (every other aten op), optimizer (anything under
// ShardedParams::adamw_step), framework (autograd engine and scope self time,
// and the step's time no op covers). The ceiling: the best of a few large
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
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/widened_gemm.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "peer/peer_cases.hpp"
#include "peer/peer_harness.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

namespace {

using namespace ditrl;
namespace prof = torch::autograd::profiler;

constexpr double kLr = 1e-4;
constexpr char kOptimizerScope[] = "ditrl::adamw_step";

const std::set<std::string> kGemm = {"aten::mm",
                                     "aten::addmm",
                                     "aten::bmm",
                                     "aten::baddbmm",
                                     "aten::addmv",
                                     "aten::mv",
                                     "aten::_convolution",
                                     "aten::mkldnn_convolution",
                                     "aten::convolution_backward",
                                     "aten::_mkl_linear",
                                     "aten::mkldnn_linear",
                                     "mkldnn::_linear_pointwise"};
const std::set<std::string> kAttention = {"aten::_softmax",
                                          "aten::_softmax_backward_data",
                                          "aten::masked_fill",
                                          "aten::masked_fill_",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu",
                                          "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
const std::set<std::string> kCopies = {
    "aten::copy_",        "aten::_to_copy",    "aten::clone",        "aten::cat",   "aten::stack", "aten::contiguous",
    "aten::index_select", "aten::narrow_copy", "aten::_unsafe_view", "aten::fill_", "aten::zero_"};

constexpr char kGemmFamily[] = "GEMM (mm, addmm, bmm, conv)";
constexpr char kAttentionFamily[] = "attention softmax / mask";
constexpr char kElementwiseFamily[] = "norms / elementwise";
constexpr char kFramework[] = "framework (autograd engine, scopes, the peer's interpreter)";

std::string family_of(const std::string& name, bool in_optimizer) {
  if (in_optimizer) return "optimizer (AdamW on the slices, re-cast)";
  if (kGemm.count(name)) return kGemmFamily;
  if (kAttention.count(name)) return kAttentionFamily;
  if (kCopies.count(name)) return "copies, casts, fills";
  if (name.rfind("aten::empty", 0) == 0 || name == "aten::resize_") return "allocation";
  if (name.rfind("aten::", 0) == 0) return kElementwiseFamily;
  return kFramework;
}

struct Op {
  std::string name;
  uint64_t start, end, thread;
  uint64_t flops;
};

struct Profile {
  std::map<std::string, double> self_seconds;  // per family
  double gemm_flops = 0;
  double step_seconds = 0;
  std::map<std::string, double> top_ops;  // self seconds per op name
  std::map<std::string, int64_t> calls;   // events per op name (nested ops included)
};

// Self time per op family from the profiler's CPU events.
Profile attribute(const std::vector<Op>& events, double step_seconds) {
  Profile p;
  p.step_seconds = step_seconds;
  std::map<uint64_t, std::vector<Op>> by_thread;
  for (const Op& e : events) by_thread[e.thread].push_back(e);
  double covered = 0;
  for (auto& [thread, ops] : by_thread) {
    std::sort(ops.begin(), ops.end(),
              [](const Op& a, const Op& b) { return a.start != b.start ? a.start < b.start : a.end > b.end; });
    struct Open {
      const Op* op;
      uint64_t children = 0;
      bool in_optimizer;
    };
    std::vector<Open> stack;
    const auto close = [&](const Open& o) {
      const double self = static_cast<double>(o.op->end - o.op->start - std::min(o.children, o.op->end - o.op->start));
      p.self_seconds[family_of(o.op->name, o.in_optimizer)] += self * 1e-9;
      p.top_ops[o.op->name] += self * 1e-9;
      ++p.calls[o.op->name];
      if (stack.empty()) covered += static_cast<double>(o.op->end - o.op->start) * 1e-9;
    };
    for (const Op& op : ops) {
      while (!stack.empty() && stack.back().op->end <= op.start) {
        const Open done = stack.back();
        stack.pop_back();
        close(done);
      }
      if (!stack.empty()) stack.back().children += op.end - op.start;
      const bool in_optimizer = op.name == kOptimizerScope || (!stack.empty() && stack.back().in_optimizer);
      stack.push_back({&op, 0, in_optimizer});
      if (kGemm.count(op.name) && !in_optimizer) p.gemm_flops += static_cast<double>(op.flops);
    }
    while (!stack.empty()) {
      const Open done = stack.back();
      stack.pop_back();
      close(done);
    }
  }
  p.self_seconds[kFramework] += std::max(0.0, step_seconds - covered);
  return p;
}

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

struct PeerProfile {
  Profile profile;
  std::string runtime;  // its malloc, torch and diffusers versions
};

// diffusers' step on the same files, profiled in a Python process
// (benchmarks/peer/peer_profile.py); its events get ditrl's attribution. The peer
// runs on ditrl's malloc: under glibc's, the profiler's own allocations made
// its profiled bf16 steps 1.5-2.4x its unprofiled ones, under tcmalloc 1.1x.
PeerProfile profile_peer(const std::string& python, const std::string& family, const std::string& dir,
                         const std::string& compute, int steps, int warmup) {
  const std::string tcmalloc = own_tcmalloc();
  const std::string command = fmt::format(
      "{}'{}' '{}/peer/peer_profile.py' --family {} --dir '{}' --precision {} --steps {} --warmup {} --optimizer-scope {}",
      tcmalloc.empty() ? "" : "LD_PRELOAD='" + tcmalloc + "' ", python, DITRL_BENCHMARKS_DIR, family, dir, compute,
      steps, warmup, kOptimizerScope);
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start: " + command);
  std::string text;
  std::array<char, 1 << 16> buffer{};
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) text.append(buffer.data(), n);
  if (pclose(pipe) != 0 || text.empty())
    throw std::runtime_error("the peer's profile failed (stderr above): " + command);
  const boost::json::value doc = boost::json::parse(text);
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

double family_seconds(const Profile& p, const std::string& family) {
  const auto it = p.self_seconds.find(family);
  return it == p.self_seconds.end() ? 0.0 : it->second;
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  std::string family_name = "sd3", compute_name = "fp32", out, work = "/tmp/ditrl_step_profile";
  std::string attention = "math", case_name = "big", trace;
  int steps = 2, warmup = 2;
  bool no_recompute = false, fused_adamw = false, with_peer = false;
  std::string python = DITRL_PYTHON;
  CLI::App app{"ditrl's training step per op family, against the measured GEMM ceiling"};
  app.add_option("--family", family_name, "sd3 | wan | qwen_image (its ~100M peer_forward config)");
  app.add_option("--case", case_name,
                 "big: the ~100M config | tiny / tiny2: the family's tiny preset, peer_forward's batch 1 / 2 case")
      ->check(CLI::IsMember({"big", "tiny", "tiny2"}));
  app.add_option("--compute", compute_name, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--attention", attention, "math | flash")->check(CLI::IsMember({"math", "flash"}));
  app.add_flag("--no-recompute", no_recompute, "every block keeps its forward's graph (parallel.recompute = false)");
  app.add_flag("--fused-adamw", fused_adamw, "LibTorch's fused AdamW kernel (train.fused_adamw = true)");
  app.add_option("--steps", steps, "profiled steps");
  app.add_option("--warmup", warmup, "steps before profiling");
  app.add_option("--work", work, "directory for the weights / inputs files");
  app.add_option("--out", out, "append the markdown section to this file (default: stdout only)");
  app.add_option(
      "--trace", trace,
      "also write the profiled steps as a Chrome trace with input shapes (benchmarks/profile/trace_ops.py reads it)");
  app.add_flag("--peer", with_peer,
               "also profile diffusers' class for the family on the same files (benchmarks/peer/peer_profile.py)");
  app.add_option("--python", python, "Python interpreter with torch and diffusers (for --peer)");
  CLI11_PARSE(app, argc, argv);
  app::keep_freed_host_memory();
  const c10::ScalarType compute = compute_name == "bf16" ? at::kBFloat16 : at::kFloat;
  at::set_num_threads(1);
  const auto comm = dist::make_mpi_communicator();

  const auto it = peer::kFamilies.find(family_name);
  if (it == peer::kFamilies.end()) {
    std::cerr << "unknown family '" << family_name << "'\n";
    return 2;
  }
  const std::vector<peer::Case> cases = it->second.cases(1, 1);
  const peer::Case c = case_name == "tiny" ? cases.front() : case_name == "tiny2" ? cases.at(1) : cases.back();
  const std::string dir = work + "/" + family_name;
  peer::prepare_case(c, dir);
  const auto family = peer::make_family(family_name, dir + "/config.json", compute, attention);
  models::load_weights(*family, io::Checkpoint(dir + "/weights.safetensors"));
  int64_t params = 0;
  for (const auto& p : family->parameters()) params += p.numel();
  shard::ShardOptions options;
  options.recompute = !no_recompute;
  options.adamw.fused = fused_adamw;
  shard::ShardedParams sharded(*family, family->wrap_units(), peer::training_plan(*family, compute), *comm, options);
  models::ForwardContext ctx;
  ctx.runner = &sharded;
  const io::SafetensorsFile file(dir + "/inputs.safetensors");
  const at::Tensor x = file.get("latents"), t = file.get("timesteps"), sigma = file.get("sigmas"),
                   target = file.get("target");
  models::Cond cond;
  for (const models::CondSpec& spec : family->cond_spec()) cond.tensors[spec.name] = file.get("cond." + spec.name);
  const auto step = [&] {
    sharded.zero_grad();
    sharded.begin_step();
    at::mse_loss(family->noise_pred(x, t, sigma, cond, ctx).to(at::kFloat), target).backward();
    sharded.finish_backward();
    RECORD_FUNCTION(kOptimizerScope, std::vector<c10::IValue>());
    sharded.adamw_step(kLr);
  };
  for (int i = 0; i < warmup; ++i) step();

  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO,
                                                     /*report_input_shapes=*/true, /*profile_memory=*/false,
                                                     /*with_stack=*/false, /*with_flops=*/true);
  const std::set<torch::profiler::impl::ActivityType> activities = {torch::profiler::impl::ActivityType::CPU};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!trace.empty()) result->save(trace);
  std::vector<Op> events;
  for (const prof::KinetoEvent& e : result->events())
    if (e.deviceType() == c10::DeviceType::CPU && e.endNs() > e.startNs())
      events.push_back({e.name(), e.startNs(), e.endNs(), e.startThreadId(), op_flops(e)});
  const Profile p = attribute(events, seconds);
  const std::optional<PeerProfile> peer =
      with_peer ? std::optional<PeerProfile>(profile_peer(python, family_name, dir, compute_name, steps, warmup))
                : std::nullopt;
  std::string shapes;
  const double ceiling = gemm_ceiling_gflops(compute, shapes);

  const double per_step = seconds / steps;
  std::vector<std::pair<std::string, double>> families(p.self_seconds.begin(), p.self_seconds.end());
  std::sort(families.begin(), families.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<std::pair<std::string, double>> ops(p.top_ops.begin(), p.top_ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  const double gemm_seconds = family_seconds(p, kGemmFamily);
  std::string md = fmt::format(
      "## {} {}, {:.1f} M parameters, {} compute, batch {} x ({} + {} tokens), 1 thread\n\n"
      "- Command: `{}`\n- Date: {}; machine: {}, 1-minute load average {} at the end\n"
      "- LibTorch {}, ShardedParams on one rank ({} attention, {}, {} AdamW); {} profiled steps after {} warm-up "
      "steps: "
      "{:.2f} ms per step "
      "(the profiler adds its own per-op cost)\n\n",
      family_name, c.name, params / 1e6, compute_name, c.batch, c.image_tokens, c.text_tokens,
      peer::command_line(argc, argv), peer::utc_now(), peer::cpu_model(), peer::load_average(), TORCH_VERSION,
      attention, no_recompute ? "no recompute" : "blocks recomputed in backward", fused_adamw ? "fused" : "chunked",
      steps, warmup, 1e3 * per_step);
  if (peer) {
    for (const auto& [name, s] : peer->profile.self_seconds)
      if (!p.self_seconds.count(name)) families.emplace_back(name, 0.0);
    md += fmt::format(
        "diffusers' {} on the same files ({}, {}; benchmarks/peer/peer_profile.py), profiled the same way: {:.2f} ms per "
        "step, **{:.2f}x ditrl's profiled step**.\n\n"
        "| op family | ditrl ms per step | share | diffusers ms per step | share |\n|---|---|---|---|---|\n",
        std::string(c.config.at("_class_name").as_string()),
        compute_name == "bf16" ? "fp32 parameters, bf16 autocast" : "fp32", peer->runtime,
        1e3 * peer->profile.step_seconds / steps, peer->profile.step_seconds / seconds);
    for (const auto& [name, s] : families) {
      const double theirs = family_seconds(peer->profile, name);
      md += fmt::format("| {} | {:.2f} | {:.1f}% | {:.2f} | {:.1f}% |\n", name, 1e3 * s / steps, 100 * s / seconds,
                        1e3 * theirs / steps, 100 * theirs / peer->profile.step_seconds);
    }
    double ours_math = 0, theirs_math = 0;
    for (const char* math : {kGemmFamily, kAttentionFamily, kElementwiseFamily}) {
      ours_math += family_seconds(p, math);
      theirs_math += family_seconds(peer->profile, math);
    }
    md += fmt::format(
        "\nThe model's math (GEMM + attention + norms / elementwise, the same LibTorch kernels on both sides): ditrl "
        "{:.2f} ms, diffusers {:.2f} ms per step. A ditrl step of nothing else would be **{:.2f}x** diffusers' "
        "profiled step.\n",
        1e3 * ours_math / steps, 1e3 * theirs_math / steps, peer->profile.step_seconds / ours_math);
  } else {
    md += "| op family | s per step | share of the step |\n|---|---|---|\n";
    for (const auto& [name, s] : families)
      md += fmt::format("| {} | {:.3f} | {:.1f}% |\n", name, s / steps, 100 * s / seconds);
  }
  md += "\nTop ops by self time (s per step): ";
  for (size_t i = 0; i < std::min<size_t>(12, ops.size()); ++i)
    md += fmt::format("{}{} {:.3f}", i ? ", " : "", ops[i].first, ops[i].second / steps);
  std::vector<std::pair<std::string, int64_t>> calls(p.calls.begin(), p.calls.end());
  std::sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  int64_t total_calls = 0;
  for (const auto& [name, n] : calls) total_calls += n;
  md += fmt::format("\n\nProfiler events per step (ops and scopes, nested ones included): {}; most called: ",
                    total_calls / steps);
  for (size_t i = 0; i < std::min<size_t>(12, calls.size()); ++i)
    md += fmt::format("{}{} {}", i ? ", " : "", calls[i].first, calls[i].second / steps);
  const double achieved = p.gemm_flops / steps / per_step / 1e9;
  md += fmt::format(
      "\n\nGEMM ceiling ({} `models::linear`, fp32 GEMMs on {}, 1 thread, GFLOP/s by shape m x k x n): {}; ceiling "
      "{:.1f} GFLOP/s. "
      "The step's GEMMs: {:.1f} GFLOP per step in {:.3f} s, {:.1f} GFLOP/s inside GEMMs = {:.0f}% of the "
      "ceiling; over the whole step {:.1f} GFLOP/s = **{:.0f}% of the ceiling**.\n\n",
      compute_name, precision::cpu_fp32_gemm_name(precision::cpu_fp32_gemm()), shapes, ceiling,
      p.gemm_flops / steps / 1e9, gemm_seconds / steps, gemm_seconds > 0 ? p.gemm_flops / gemm_seconds / 1e9 : 0.0,
      gemm_seconds > 0 ? 100 * p.gemm_flops / gemm_seconds / 1e9 / ceiling : 0.0, achieved, 100 * achieved / ceiling);
  std::cout << md;
  if (!out.empty()) std::ofstream(out, std::ios::app) << md;
  return 0;
}
