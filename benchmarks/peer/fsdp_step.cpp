// ditrl's side of benchmarks/peer/fsdp_step.py: N ranks train a family's ~100M
// config through shard::ShardedParams (what `ditrl train` runs: fp32 masters
// and AdamW on the rank's slices, bf16 compute copies gathered per block,
// fp32 gradient reduce-scatter, every block recomputed in backward) on a
// fixed global batch split over the ranks; the peer is PyTorch FSDP2 on
// diffusers' class (benchmarks/peer/peer_fsdp2.py) with the same files.
//
//   bench_fsdp_step prepare DIR [--family sd3] [--batch 4] [--tiny]
//       writes DIR/config.json, weights.safetensors, inputs.safetensors
//   mpiexec -n N bench_fsdp_step run DIR [--family sd3] [--steps 3] [--no-recompute] [--fused-adamw]
//                                        [--attention math|flash]
//       one warm-up step, then `steps` timed ones; rank 0 prints one JSON
//       line {"ranks", "params", "step_seconds", "losses"}; --no-recompute:
//       every block keeps its forward's graph (parallel.recompute = false)
//
// Bytes moved: run under benchmarks/mpi_bytes_shim.so (LD_PRELOAD); the
// benchmark resets its counters after the warm-up step, so the files it
// writes at MPI_Finalize hold the timed steps only.

#include <ditrl/app/named_option.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "peer/peer_cases.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include <dlfcn.h>
#include <chrono>
#include <iostream>

namespace {

using namespace ditrl;

constexpr double kLr = 1e-4;
constexpr double kWeightDecay = 0.01;  // torch.optim.AdamW's default, as the peer uses

// The family's ~100M case (the last of its peer_forward cases), or its tiny
// preset (the first: a quick check of the pipeline), at `batch`.
peer::Case bench_case(const std::string& family, bool tiny, int64_t batch) {
  const auto it = peer::kFamilies.find(family);
  if (it == peer::kFamilies.end()) throw std::runtime_error("unknown family '" + family + "'");
  const std::vector<peer::Case> cases = it->second.cases(1, 1);
  peer::Case c = tiny ? cases.front() : cases.back();
  c.batch = batch;
  return c;
}

void reset_shim_counters() {
  using Reset = void (*)();
  if (const auto reset = reinterpret_cast<Reset>(dlsym(RTLD_DEFAULT, "mpi_bytes_shim_reset"))) reset();
}

int run(const std::string& dir, const std::string& family_name, int steps, bool recompute, bool fused_adamw,
        models::AttentionBackend attention) {
  const auto comm = dist::make_mpi_communicator();
  at::set_num_threads(1);
  const auto family = peer::make_family(family_name, dir + "/config.json", at::kBFloat16, attention);
  models::load_weights(*family, io::Checkpoint(dir + "/weights.safetensors"));
  int64_t params = 0;
  for (const auto& p : family->parameters()) params += p.numel();
  shard::ShardOptions options;
  options.adamw.weight_decay = kWeightDecay;
  options.recompute = recompute;
  options.adamw.fused = fused_adamw;
  shard::ShardedParams sharded(*family, family->wrap_units(), peer::training_plan(*family, at::kBFloat16), *comm,
                               options);
  models::ForwardContext ctx;
  ctx.runner = &sharded;

  const io::SafetensorsFile file(dir + "/inputs.safetensors");
  const at::Tensor latents = file.get("latents");
  const int64_t batch = latents.size(0);
  if (batch % comm->size() != 0)
    throw std::runtime_error(
        fmt::format("{}/inputs.safetensors: batch {} does not split over {} ranks", dir, batch, comm->size()));
  const int64_t rows = batch / comm->size();
  const auto slice = [&](const at::Tensor& t) { return t.narrow(0, comm->rank() * rows, rows).contiguous(); };
  const at::Tensor x = slice(latents), t = slice(file.get("timesteps")), sigma = slice(file.get("sigmas")),
                   target = slice(file.get("target"));
  models::Cond cond;
  for (const models::CondSpec& spec : family->cond_spec())
    cond.tensors[spec.name] = slice(file.get("cond." + spec.name));

  boost::json::array seconds, losses;
  for (int step = 0; step <= steps; ++step) {
    comm->barrier();
    if (step == 1) reset_shim_counters();
    const auto start = std::chrono::steady_clock::now();
    sharded.zero_grad();
    sharded.begin_step();
    const at::Tensor loss = at::mse_loss(family->noise_pred(x, t, sigma, cond, ctx).to(at::kFloat), target);
    loss.backward();
    sharded.finish_backward();
    sharded.adamw_step(kLr);
    losses.push_back(loss.item<double>());
    comm->barrier();
    if (step > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (comm->rank() == 0)
    std::cout << boost::json::serialize(boost::json::object{
                     {"ranks", comm->size()}, {"params", params}, {"step_seconds", seconds}, {"losses", losses}})
              << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  std::string mode, dir, family = "sd3";
  int64_t batch = 4;
  int steps = 3;
  bool tiny = false, no_recompute = false, fused_adamw = false;
  models::AttentionBackend attention = models::AttentionBackend::Math;
  CLI::App app{"ditrl ShardedParams training step on N ranks (the FSDP2 comparison's ditrl side)"};
  app.add_option("mode", mode, "prepare | run")->required()->check(CLI::IsMember({"prepare", "run"}));
  app.add_option("dir", dir, "directory of config.json, weights.safetensors, inputs.safetensors")->required();
  app.add_option("--family", family, "sd3 | wan | qwen_image (its ~100M peer_forward config)");
  app.add_option("--batch", batch, "global batch (prepare)");
  app.add_flag("--tiny", tiny, "the family's tiny preset instead of its ~100M config (prepare)");
  app.add_option("--steps", steps, "timed steps after one warm-up step (run)");
  app.add_flag("--no-recompute", no_recompute, "keep every block's graph instead of recomputing it (run)");
  app.add_flag("--fused-adamw", fused_adamw, "LibTorch's fused AdamW kernel (run)");
  app::add_named_option(app, "--attention", attention, models::kAttentionNames,
                        {models::AttentionBackend::Math, models::AttentionBackend::Flash}, "math | flash (run)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (mode == "run") return run(dir, family, steps, !no_recompute, fused_adamw, attention);
    if (mpi.world().size != 1) throw std::runtime_error("prepare runs on one rank");
    peer::prepare_case(bench_case(family, tiny, batch), dir);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_fsdp_step: " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
