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
#include <ditrl/app/named_option.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "gpu/kernel_profile.hpp"
#include "peer/peer_cases.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
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

precision::CompiledPlan bf16_plan(models::Family& family) {
  std::vector<precision::DtypeRule> rules;
  for (const models::DtypeOverride& o : family.default_overrides())
    rules.push_back({o.pattern, o.dtype, "family default \"" + o.pattern + "\"", false});
  std::vector<std::string> names;
  for (const auto& item : family.named_parameters()) names.push_back(item.key());
  return precision::PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, rules).compile(names);
}

struct Options {
  std::string model, size = "full", device_name = "cuda", out, profile;
  models::AttentionBackend attention = models::AttentionBackend::Math;
  int warmup = 3, steps = 10;
  int64_t batch = 1;
  bool recompute = false, chunked_adamw = false, deterministic = false;
};

// Returns --attention, whose default depends on --device.
const CLI::Option* add_options(CLI::App& app, Options& o) {
  app.add_option("--model", o.model)->required()->check(CLI::IsMember({"sd3.5-medium", "wan2.1-1.3b"}));
  app.add_option("--size", o.size)->check(CLI::IsMember({"full", "tiny"}));
  app.add_option("--device", o.device_name)->check(CLI::IsMember({"cuda", "cpu"}));
  const CLI::Option* attention = app::add_named_option(app, "--attention", o.attention, models::kAttentionNames,
                                                       "SDPA backend (default: flash on cuda, math on cpu)");
  app.add_flag("--recompute", o.recompute,
               "rebuild each block's graph in backward (parallel.recompute = true; the peer keeps its activations)");
  app.add_flag("--chunked-adamw", o.chunked_adamw,
               "ditrl's chunked AdamW passes instead of the fused kernel (train.fused_adamw = false; the peer runs "
               "torch's fused AdamW on CUDA)");
  app.add_flag("--deterministic", o.deterministic,
               "ditrl's deterministic mode on CUDA (deterministic algorithms, TF32 and reduced-precision reductions "
               "off: app::pin_gpu_kernels), to time what it costs; the peer has no such mode");
  app.add_option("--batch", o.batch, "samples per step, each at the model's token count")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup);
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber);
  app.add_option("--out", o.out)->required();
  app.add_option("--profile", o.profile,
                 "then profile two steps' CUDA kernels and append where the GPU's time went to this markdown file");
  return attention;
}

// The runtime on the chosen device, its GPU kernels set as the comparison needs.
std::unique_ptr<dist::Runtime> start_runtime(const Options& o) {
  // cuBLAS reads it at its first handle: before any CUDA work, as `ditrl train`'s re-exec sets it.
  if (o.deterministic) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  dist::RuntimeOptions ro;
  ro.device = o.device_name;
  ro.deterministic = o.deterministic;  // default: the fast kernels, as the peer runs
  auto runtime = dist::Runtime::create(ro);
  const c10::Device device = runtime->device();
  if (device.is_cuda() && o.deterministic) {
    app::pin_gpu_kernels();
  } else if (device.is_cuda()) {
    // TF32 off, as the peer sets it, and nothing else: app::pin_gpu_kernels()
    // would also turn on deterministic algorithms (flash attention's slower
    // deterministic backward), which the peer does not run.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
  }
  return runtime;
}

// The family built from the spec's config.json keys (written beside --out).
std::shared_ptr<models::Family> build_family(const Options& o, const Spec& spec, const c10::Device& device) {
  const std::string config = o.out + ".config.json";
  std::ofstream(config) << json::serialize(spec.config);
  models::FamilyOptions fo;
  fo.family = spec.family;
  fo.config_json = config;
  fo.device = device;
  fo.attention = o.attention;
  using precision::InputDtype;
  fo.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, at::kBFloat16);
  return models::create_family(fo);
}

// The timed steps' seconds (sorted) and losses, after the warm-up steps.
struct Timed {
  std::vector<double> sorted_seconds, losses;
  double median() const { return sorted_seconds[sorted_seconds.size() / 2]; }
};

Timed time_steps(const Options& o, const std::function<void()>& step, const at::Tensor& loss,
                 const c10::Device& device) {
  Timed timed;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    step();
    if (i >= o.warmup) {
      timed.sorted_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      timed.losses.push_back(loss.item<double>());
    }
  }
  std::sort(timed.sorted_seconds.begin(), timed.sorted_seconds.end());
  for (double l : timed.losses)
    if (!std::isfinite(l)) throw std::runtime_error(fmt::format("bench_gpu_step: loss {} is not finite", l));
  return timed;
}

int64_t parameter_count(models::Family& family) {
  int64_t params = 0;
  for (const auto& p : family.parameters()) params += p.numel();
  return params;
}

// One JSON object with the peer's field names (benchmarks/gpu/diffusers_step.py).
json::object result_json(const Options& o, const Spec& spec, int64_t params, const c10::Device& device,
                         const Timed& timed) {
  return {{"side", fmt::format("ditrl (LibTorch {}), ShardedParams on 1 rank", TORCH_VERSION)},
          {"model", o.model},
          {"size", o.size},
          {"device", device.is_cuda() ? "cuda" : "cpu"},
          {"params", params},
          {"batch", o.batch},
          {"image_tokens", spec.image_tokens},
          {"text_tokens", spec.text_tokens},
          {"attention", name_of(models::kAttentionNames, o.attention)},
          {"precision", "fp32 masters and AdamW moments, bf16 compute copies, fp32 gradient reduction"},
          {"recompute", o.recompute},
          {"adamw", o.chunked_adamw ? "chunked" : "fused"},
          {"deterministic", o.deterministic},
          {"steps", o.steps},
          {"step_s_median", timed.median()},
          {"step_s_min", timed.sorted_seconds.front()},
          {"loss_first", timed.losses.front()},
          {"loss_last", timed.losses.back()},
          {"peak_memory_gib", peak_memory_gib(device)}};
}

// Builds, times and reports the step; with --profile, then profiles it.
void run(const Options& o) {
  auto runtime = start_runtime(o);
  const c10::Device device = runtime->device();
  const Spec& spec = kModels.at(o.model).at(o.size);
  auto family = build_family(o, spec, device);
  const int64_t params = parameter_count(*family);  // before ShardedParams takes the parameters over
  shard::ShardOptions so;
  so.device = device;
  so.recompute = o.recompute;
  so.adamw.fused = !o.chunked_adamw;
  shard::ShardedParams sharded(*family, family->wrap_units(), bf16_plan(*family), runtime->data(), so);
  models::ForwardContext ctx;
  ctx.runner = &sharded;
  const Inputs in = draw_inputs(*family, spec, o.batch, device);
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
  const Timed timed = time_steps(o, step, loss, device);
  const json::object result = result_json(o, spec, params, device, timed);
  std::ofstream(o.out) << json::serialize(result) << "\n";
  std::cout << json::serialize(result) << "\n";
  // After the JSON: the timed result stands whatever the profiler does.
  if (!o.profile.empty())
    std::ofstream(o.profile, std::ios::app) << gpu_step::profile_steps(
        step, fmt::format("ditrl, {} at batch {} ({} attention, {:.1f} ms per timed step)", o.model, o.batch,
                          name_of(models::kAttentionNames, o.attention), timed.median() * 1e3));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ditrl's side of the GPU training-step benchmark (benchmarks/gpu/run.sh)"};
  const CLI::Option* attention = add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (!o.profile.empty() && o.device_name != "cuda") {
    std::cerr << "bench_gpu_step: --profile times CUDA kernels; it needs --device cuda\n";
    return 2;
  }
  if (attention->count() == 0)
    o.attention = o.device_name == "cuda" ? models::AttentionBackend::Flash : models::AttentionBackend::Math;
  try {
    run(o);
  } catch (const std::exception& e) {
    return dist::report_fatal(e);
  }
  return 0;
}
