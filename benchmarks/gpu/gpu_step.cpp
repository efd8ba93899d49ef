// ditrl's side of the GPU training-step benchmark (benchmarks/gpu/run.sh;
// the peer is benchmarks/gpu/diffusers_step.py): the same SD3.5-medium-sized
// and Wan2.1-1.3B-sized models, built by ditrl's families from the same
// config.json keys, trained the way `ditrl train` trains them on one rank:
// ShardedParams holding fp32 masters and AdamW moments, bf16 compute copies,
// gradients reduced in fp32, only the chosen SDPA backend enabled. One step =
// forward + MSE loss against a fixed target + backward + AdamW, on the peer's
// token counts. Writes one JSON object with the peer's field names; with
// --profile, then profiles two more steps and appends where the GPU's time went.
//
//   bench_gpu_step --model sd3.5-medium --size full --device cuda --out sd3.json [--profile sd3.profile.md]
//   bench_gpu_step --model wan2.1-1.3b --size tiny --device cpu --out wan.json   (CI: runs here)

#include <ditrl/app/determinism.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "peer/peer_cases.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>

#ifdef DITRL_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace json = boost::json;
using namespace ditrl;

namespace {

struct Spec {
  std::string family;
  json::object config;        // diffusers config.json keys, as diffusers_step.py passes them
  std::vector<int64_t> grid;  // latent frames x height x width (frames 1 for images)
  int64_t image_tokens, text_tokens;
};

// SD3's first `n` blocks as dual-attention (MMDiT-X) layers.
json::array first_layers(int64_t n) {
  json::array out;
  for (int64_t i = 0; i < n; ++i) out.push_back(i);
  return out;
}

// Keep in step with MODELS in benchmarks/gpu/diffusers_step.py.
const std::map<std::string, std::map<std::string, Spec>> kModels = {
    {"sd3.5-medium",
     {{"full", {"sd3", peer::sd3_config(128, 24, 24, 64, 4096, 2048, 384, first_layers(13)), {1, 128, 128}, 4096, 333}},
      {"tiny", {"sd3", peer::sd3_config(16, 2, 2, 16, 64, 32, 16, first_layers(1)), {1, 16, 16}, 64, 12}}}},
    {"wan2.1-1.3b",
     {{"full", {"wan", peer::wan_config(30, 12, 128, 8960, 4096, 256), {9, 60, 104}, 14040, 512}},
      {"tiny", {"wan", peer::wan_config(2, 2, 16, 64, 64, 32), {3, 8, 8}, 48, 12}}}},
};

void synchronize(const c10::Device& device) {
#ifdef DITRL_CUDA
  if (device.is_cuda()) cudaDeviceSynchronize();
#else
  (void)device;
#endif
}

double peak_memory_gib(const c10::Device& device) {
#ifdef DITRL_CUDA
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
               .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
               .peak /
           std::pow(2.0, 30);
#else
  (void)device;
#endif
  return -1;
}

struct Inputs {
  at::Tensor latents, timesteps, sigmas, target;
  models::Cond cond;
};

// The peer's draws: latents, the text conditioning, t = 500, target (other
// values than the peer's generator gives; the step's cost does not depend on them).
Inputs draw_inputs(models::Family& family, const Spec& spec, int64_t batch, const c10::Device& device) {
  at::manual_seed(0);
  const auto on = at::TensorOptions().device(device);
  Inputs in;
  const std::vector<int64_t> shape = family.latent_shape(batch, {spec.grid[0], spec.grid[1], spec.grid[2]});
  in.latents = at::randn(shape, on);
  for (const models::CondSpec& c : family.cond_spec()) {
    std::vector<int64_t> s = {batch};
    s.insert(s.end(), c.shape.begin(), c.shape.end());
    if (c.name == "encoder_hidden_states") s[1] = spec.text_tokens;
    in.cond.tensors[c.name] =
        c10::isFloatingType(c.dtype) ? at::randn(s, on).to(c.dtype) : at::ones(s, on.dtype(c.dtype));
  }
  in.timesteps = at::full({batch}, 500.0, on);
  in.sigmas = in.timesteps / 1000;
  in.target = at::randn(shape, on);
  return in;
}

// A CUDA kernel's op family, from its name (cuBLAS: nvjet / *gemm* / cutlass;
// flash and memory-efficient attention: flash / fmha; torch's fused AdamW).
std::string kernel_family(const std::string& name) {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kFamilies = {
      {"attention", {"flash", "fmha", "attention"}},
      {"GEMM", {"nvjet", "gemm", "Gemm", "cutlass", "xmma"}},
      {"optimizer (fused AdamW)", {"Adam"}},
      {"norms", {"norm", "Norm", "Moments", "GammaBeta"}},
      {"copies, casts, fills", {"copy", "Copy", "Memcpy", "Memset", "fill", "CatArray"}},
      {"reductions", {"reduce_kernel"}},
  };
  for (const auto& [family, needles] : kFamilies)
    for (const std::string& needle : needles)
      if (name.find(needle) != std::string::npos) return family;
  return "elementwise and other";
}

// Two steps under LibTorch's Kineto profiler: each kernel's, memcpy's and
// memset's device time summed by family against the steps' wall time; where
// no device work runs the GPU waits for the host (a launch-bound step).
std::string profile_steps(const std::function<void()>& step, const std::string& title) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  constexpr int kSteps = 2;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities = {ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) step();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kSteps;
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();

  const std::set<uint8_t> device_work = {static_cast<uint8_t>(libkineto::ActivityType::CONCURRENT_KERNEL),
                                         static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMCPY),
                                         static_cast<uint8_t>(libkineto::ActivityType::GPU_MEMSET)};
  std::map<std::string, double> by_family, by_kernel;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const prof::KinetoEvent& e : result->events()) {
    if (!device_work.count(e.activityType()) || e.endNs() <= e.startNs()) continue;
    const double seconds = static_cast<double>(e.durationNs()) * 1e-9 / kSteps;
    by_family[kernel_family(e.name())] += seconds;
    by_kernel[e.name()] += seconds;
    spans.emplace_back(e.startNs(), e.endNs());
  }
  // Busy: the union of the device spans (streams overlap).
  std::sort(spans.begin(), spans.end());
  double busy = 0;
  uint64_t open = 0, close = 0;
  for (const auto& [b, e] : spans) {
    if (b > close) {
      busy += static_cast<double>(close - open);
      open = b;
    }
    close = std::max(close, e);
  }
  busy = (busy + static_cast<double>(close - open)) * 1e-9 / kSteps;
  std::string md = fmt::format(
      "### {}: where the GPU's time goes\n\n{} profiled steps: {:.1f} ms of wall time per step, the GPU busy {:.1f} "
      "ms of it ({:.0f}%; the rest it waits for the host). Device time per step by kernel family (streams may "
      "overlap):\n\n| kernel family | ms per step | share of the wall time |\n|---|---|---|\n",
      title, kSteps, wall * 1e3, busy * 1e3, 100 * busy / wall);
  std::vector<std::pair<std::string, double>> families(by_family.begin(), by_family.end()),
      kernels(by_kernel.begin(), by_kernel.end());
  const auto longest = [](const auto& a, const auto& b) { return a.second > b.second; };
  std::sort(families.begin(), families.end(), longest);
  std::sort(kernels.begin(), kernels.end(), longest);
  for (const auto& [family, seconds] : families)
    md += fmt::format("| {} | {:.2f} | {:.1f}% |\n", family, seconds * 1e3, 100 * seconds / wall);
  md += "\nLongest kernels (ms per step):\n\n";
  for (size_t i = 0; i < std::min<size_t>(10, kernels.size()); ++i)
    md += fmt::format("- {:.2f} `{}`\n", kernels[i].second * 1e3, kernels[i].first.substr(0, 120));
  return md + "\n";
}

precision::CompiledPlan bf16_plan(models::Family& family) {
  std::vector<precision::DtypeRule> rules;
  for (const models::DtypeOverride& o : family.default_overrides())
    rules.push_back({o.pattern, precision::parse_dtype(o.dtype), "family default \"" + o.pattern + "\"", false});
  std::vector<std::string> names;
  for (const auto& item : family.named_parameters()) names.push_back(item.key());
  return precision::PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, rules).compile(names);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, size = "full", device_name = "cuda", attention, out, profile;
  int warmup = 3, steps = 10;
  int64_t batch = 1;
  bool recompute = false, chunked_adamw = false, deterministic = false;
  CLI::App app{"ditrl's side of the GPU training-step benchmark (benchmarks/gpu/run.sh)"};
  app.add_option("--model", model)->required()->check(CLI::IsMember({"sd3.5-medium", "wan2.1-1.3b"}));
  app.add_option("--size", size)->check(CLI::IsMember({"full", "tiny"}));
  app.add_option("--device", device_name)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--attention", attention, "SDPA backend (default: flash on cuda, math on cpu)");
  app.add_flag("--recompute", recompute,
               "rebuild each block's graph in backward (parallel.recompute = true; the peer keeps its activations)");
  app.add_flag("--chunked-adamw", chunked_adamw,
               "ditrl's chunked AdamW passes instead of the fused kernel (train.fused_adamw = false; the peer runs "
               "torch's fused AdamW on CUDA)");
  app.add_flag("--deterministic", deterministic,
               "ditrl's deterministic mode on CUDA (deterministic algorithms, TF32 and reduced-precision reductions "
               "off: app::pin_gpu_kernels), to time what it costs; the peer has no such mode");
  app.add_option("--batch", batch, "samples per step, each at the model's token count")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup);
  app.add_option("--steps", steps)->check(CLI::PositiveNumber);
  app.add_option("--out", out)->required();
  app.add_option("--profile", profile,
                 "then profile two steps' CUDA kernels and append where the GPU's time went to this markdown file");
  CLI11_PARSE(app, argc, argv);
  if (!profile.empty() && device_name != "cuda") {
    std::cerr << "bench_gpu_step: --profile times CUDA kernels; it needs --device cuda\n";
    return 2;
  }
  if (attention.empty()) attention = device_name == "cuda" ? "flash" : "math";
  try {
    // cuBLAS reads it at its first handle: before any CUDA work, as `ditrl train`'s re-exec sets it.
    if (deterministic) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    dist::RuntimeOptions ro;
    ro.device = device_name;
    ro.deterministic = deterministic;  // default: the fast kernels, as the peer runs
    auto runtime = dist::Runtime::create(ro);
    const c10::Device device = runtime->device();
    if (device.is_cuda() && deterministic) {
      app::pin_gpu_kernels();
    } else if (device.is_cuda()) {
      // TF32 off, as the peer sets it, and nothing else: app::pin_gpu_kernels()
      // would also turn on deterministic algorithms (flash attention's slower
      // deterministic backward), which the peer does not run.
      at::globalContext().setAllowTF32CuBLAS(false);
      at::globalContext().setAllowTF32CuDNN(false);
    }
    const Spec& spec = kModels.at(model).at(size);
    const std::string config = out + ".config.json";
    std::ofstream(config) << json::serialize(spec.config);

    models::FamilyOptions fo;
    fo.family = spec.family;
    fo.config_json = config;
    fo.device = device;
    fo.attention = attention;
    fo.inputs = precision::InputPolicy::resolve("default", "default", "passthrough", at::kBFloat16);
    auto family = models::create_family(fo);
    int64_t params = 0;
    for (const auto& p : family->parameters()) params += p.numel();
    shard::ShardOptions so;
    so.device = device;
    so.recompute = recompute;
    so.adamw.fused = !chunked_adamw;
    shard::ShardedParams sharded(*family, family->wrap_units(), bf16_plan(*family), runtime->data(), so);
    models::ForwardContext ctx;
    ctx.runner = &sharded;
    const Inputs in = draw_inputs(*family, spec, batch, device);

    at::Tensor loss;
    const auto step = [&] {
      sharded.zero_grad();
      sharded.begin_step();
      loss =
          at::mse_loss(family->noise_pred(in.latents, in.timesteps, in.sigmas, in.cond, ctx).to(at::kFloat), in.target);
      loss.backward();
      sharded.finish_backward();
      sharded.adamw_step(1e-5);
      synchronize(device);
    };
    std::vector<double> times, losses;
    for (int i = 0; i < warmup + steps; ++i) {
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      step();
      if (i >= warmup) {
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        losses.push_back(loss.item<double>());
      }
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    for (double l : losses)
      if (!std::isfinite(l)) throw std::runtime_error(fmt::format("bench_gpu_step: loss {} is not finite", l));
    const json::object result = {
        {"side", fmt::format("ditrl (LibTorch {}), ShardedParams on 1 rank", TORCH_VERSION)},
        {"model", model},
        {"size", size},
        {"device", device.is_cuda() ? "cuda" : "cpu"},
        {"params", params},
        {"batch", batch},
        {"image_tokens", spec.image_tokens},
        {"text_tokens", spec.text_tokens},
        {"attention", attention},
        {"precision", "fp32 masters and AdamW moments, bf16 compute copies, fp32 gradient reduction"},
        {"recompute", recompute},
        {"adamw", chunked_adamw ? "chunked" : "fused"},
        {"deterministic", deterministic},
        {"steps", steps},
        {"step_s_median", median},
        {"step_s_min", sorted.front()},
        {"loss_first", losses.front()},
        {"loss_last", losses.back()},
        {"peak_memory_gib", peak_memory_gib(device)}};
    std::ofstream(out) << json::serialize(result) << "\n";
    std::cout << json::serialize(result) << "\n";
    // After the JSON: the timed result stands whatever the profiler does.
    if (!profile.empty())
      std::ofstream(profile, std::ios::app)
          << profile_steps(step, fmt::format("ditrl, {} at batch {} ({} attention, {:.1f} ms per timed step)", model,
                                             batch, attention, median * 1e3));
  } catch (const std::exception& e) {
    return dist::report_fatal(e);
  }
  return 0;
}
