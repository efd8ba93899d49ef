#include <ditrl/app/determinism.hpp>
#include <ditrl/app/host_malloc.hpp>
#include <ditrl/app/memory_check.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/log.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/rl/loss_window.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>

namespace ditrl::app {

namespace {

// The batch knobs against the `world` shares the samples are split into:
// the ranks, or the sequence-parallel groups (docs/algorithms.md §8).
void check_batching(const config::Config& c, const rl::AlgorithmTraits& traits, int world) {
  if (c.train.global_batch % world != 0)
    fail("{}: train.global_batch = {} is not divisible by the {} {}", c.source, c.train.global_batch, world,
         c.parallel.sequence_parallel > 1 ? "sequence-parallel groups (ranks / parallel.sequence_parallel)" : "ranks");
  const int64_t window_samples = c.train.global_batch / world;
  const int64_t samples_per_rank = c.rollout.batch * c.rollout.samples_per_prompt / world;
  const int64_t microgroup = sampler_options(c).microgroup;
  if (samples_per_rank % microgroup != 0)
    fail(
        "{}: a rank's {} rollout samples (rollout.batch x rollout.samples_per_prompt / ranks) do not split into "
        "micro-groups of {} (rollout.microgroup, else train.micro_batch)",
        c.source, samples_per_rank, microgroup);
  // A window trains whole chunks (rl/loss_window.hpp), which keeps its
  // samples and summation tree the same at every rank count.
  if (traits.microgroup_batches) {
    if (window_samples % microgroup != 0)
      fail(
          "{}: a rank's optimizer window holds {} samples (train.global_batch / ranks), which do not split into "
          "micro-batches of {} (GRPO micro-batches are rollout micro-groups: rollout.microgroup, else "
          "train.micro_batch)",
          c.source, window_samples, microgroup);
    return;
  }
  const int64_t pairs_per_sample =
      rl::chunk_pairs_per_sample(c.train.loss, c.rollout.steps, c.rollout.timestep_fraction);
  const int64_t chunk = rl::chunk_samples(pairs_per_sample, c.train.micro_batch);
  if (window_samples % chunk != 0)
    fail(
        "{}: a rank's optimizer window holds {} samples (train.global_batch / ranks), not whole chunks of {} "
        "samples (the fewest whose {} pair(s) each fill whole micro-batches of train.micro_batch = {})",
        c.source, window_samples, chunk, pairs_per_sample, c.train.micro_batch);
}

void check_files(const config::Config& c) {
  for (const auto& [key, path] : {std::pair<const char*, std::string>{"model.weights", c.model.weights},
                                  {"model.weights_2", c.model.weights_2},
                                  {"model.lora.weights", c.model.lora.weights},
                                  {"data.prompts", c.data.prompts},
                                  {"data.sft_latents", c.data.sft_latents},
                                  {"log.decoder", c.log.decoder}})
    if (!path.empty() && !std::filesystem::exists(path)) fail("{}: {} = \"{}\": no such file", c.source, key, path);
  for (const config::RewardSection& r : config::reward_list(c))
    for (const auto& [key, path] : {std::pair<const char*, std::string>{"module", r.module}, {"decoder", r.decoder}})
      if (!path.empty() && !std::filesystem::exists(path))
        fail("{}: {}.{} = \"{}\": no such file", c.source,
             r.name.empty() ? std::string("reward") : fmt::format("reward \"{}\"", r.name), key, path);
  const std::string& resume = c.checkpoint.resume;
  if (!resume.empty() && resume != "latest" && resume != "auto" && resume != "none" &&
      !std::filesystem::is_regular_file(resume))
    fail("{}: checkpoint.resume = \"{}\": no such file (expected \"latest\", \"auto\", \"none\" or a checkpoint file)",
         c.source, resume);
}

// Each rank writes its own samples' forwards to its own serial file, in
// OUT/debug or the folder the caller chose (a standalone rollout's own).
std::unique_ptr<rl::ParityDump> open_parity_dump(const config::Config& c, const rl::AlgorithmTraits& traits, int rank,
                                                 const std::string& dump_dir) {
  const std::filesystem::path dir =
      dump_dir.empty() ? std::filesystem::path(c.run.out_dir) / "debug" : std::filesystem::path(dump_dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / fmt::format("dump-rank{}.h5", rank)).string();
  auto dump =
      std::make_unique<rl::ParityDump>(path, rl::ParityDumpOptions{c.debug.rollouts, c.debug.samples, c.debug.steps});
  spdlog::info("[debug] dump: rollouts [{}], samples [{}], steps [{}] -> {}{}", fmt::join(c.debug.rollouts, ", "),
               fmt::join(c.debug.samples, ", "),
               c.debug.steps.empty() ? std::string("trained") : fmt::format("{}", fmt::join(c.debug.steps, ", ")), path,
               traits.microgroup_batches ? ""
                                         : fmt::format(" (rollout side only: the {} training forward runs on "
                                                       "corrupted latents, not the rollout's)",
                                                       name_of(rl::kLossNames, c.train.loss)));
  return dump;
}

// Every rank's own figure (its log): what it read of the weights, how fast.
// The load's wall time split by phase: the sliced family built and its
// weights validated, then the slices (shard::take_slices, models::LoadStats).
void log_load(const config::Config& c, const models::ParameterSource& source, double build_s, double seconds) {
  const models::LoadStats& s = source.stats;
  const std::string phases = fmt::format(
      "family + validation {:.2f} s, slices: allocate {:.2f} s ({:.3f} GB of frozen slices mapped from the files), "
      "read {:.2f} s ({} thread{}; copies {:.2f} s), moments {:.2f} s",
      build_s, s.allocate_s, static_cast<double>(s.mapped_bytes) / 1e9, s.read_s, s.threads, s.threads == 1 ? "" : "s",
      s.copy_s, s.state_s);
  if (s.bytes == 0) {
    spdlog::info("[load] seeded init (model.init_seed = {}): this rank's slices in {:.2f} s ({}); {}",
                 c.model.init_seed, seconds, phases, dist::memory_text());
    return;
  }
  const double gb = static_cast<double>(s.bytes) / 1e9, read = static_cast<double>(s.bytes - s.mapped_bytes) / 1e9;
  spdlog::info("[load] {}: read this rank's slices, {:.3f} GB, in {:.2f} s ({:.2f} GB/s; reads {:.2f} GB/s) ({}); {}",
               c.model.weights, gb, seconds, gb / seconds, s.read_s > 0 ? read / s.read_s : 0.0, phases,
               dist::memory_text());
}

// Set before any forward, so rollout and training run the same GEMMs.
void use_cpu_gemms(const config::Config& c, c10::Device device) {
  const precision::CpuHalfGemm half = precision::parse_cpu_half_gemm(c.precision.cpu_half_gemm);
  precision::set_cpu_half_gemm(half);
  const precision::CpuFp32Gemm fp32 = precision::parse_cpu_fp32_gemm(c.precision.cpu_fp32_gemm, c.run.deterministic);
  precision::set_cpu_fp32_gemm(fp32);
  if (!device.is_cpu()) return;
  const bool widened = half == precision::CpuHalfGemm::Widened;
  if (c.precision.forward != at::kFloat)
    spdlog::info("{} GEMMs on the CPU: {} (precision.cpu_half_gemm = \"{}\"{})",
                 precision::dtype_name(c.precision.forward),
                 widened ? "widened to fp32, rounded once" : "LibTorch's own kernels", c.precision.cpu_half_gemm,
                 c.precision.cpu_half_gemm != "auto" ? ""
                 : widened                           ? ": this CPU has no AVX512-BF16 / AMX-BF16"
                                                     : ": this CPU has AVX512-BF16 or AMX-BF16");
  const bool onednn = fp32 == precision::CpuFp32Gemm::Onednn;
  spdlog::info("fp32 GEMMs on the CPU: {} (precision.cpu_fp32_gemm = \"{}\"{})",
               onednn ? "oneDNN's matmul from 2^20 multiply-adds up, LibTorch's BLAS below" : "LibTorch's BLAS",
               c.precision.cpu_fp32_gemm,
               c.precision.cpu_fp32_gemm != "auto" ? ""
               : onednn                            ? ": not deterministic, not an Intel CPU"
               : c.run.deterministic               ? ": deterministic runs keep the BLAS, which MKL_CBWR pins"
                                                   : ": an Intel CPU, or no oneDNN in this LibTorch");
}

// The host-staged backend waits for the GPU at every collective, which
// debug.forbid_host_sync exists to catch (docs/gpus-and-clusters.md). Every
// rank reaches the same verdict, so each raises it and none is left waiting.
void refuse_staged_with_forbidden_sync(const config::Config& c, const dist::Runtime& runtime) {
  if (c.debug.forbid_host_sync && runtime.device().is_cuda() && runtime.data_backend() == dist::DataBackend::Mpi)
    throw dist::AgreedError(
        "debug.forbid_host_sync = true with parallel.data_backend = \"mpi\" on a GPU: the MPI data backend copies "
        "every collective through host memory, waiting for the GPU each time; use data_backend = \"nccl\"");
}

}  // namespace

void check_run_inputs(const config::Config& config, int world, bool files) {
  // Samples are split over the sequence-parallel groups, not the ranks.
  int groups = world;
  try {
    groups = dist::sequence_layout(0, world, static_cast<int>(config.parallel.sequence_parallel)).data_size;
  } catch (const Error& e) {
    fail("{}: {}", config.source, e.what());
  }
  check_batching(config, rl::algorithm_traits(config.train.loss), groups);
  if (files) check_files(config);
}

void check_trainable(const config::Config& config) {
  if (!rl::algorithm_traits(config.train.loss).sde_rollout) return;
  if (strategy_options(config).strategy == rl::StepStrategy::OdeAndReturnLast)
    fail(
        "{}: train.loss = \"{}\" trains on the rollout's SDE steps, and rollout.sde = \"{}\" with rollout.strategy "
        "= \"{}\" samples none (use sde = \"sde\" or \"cps\" and an SDE strategy; `ditrl rollout` writes pure-ODE "
        "rollouts)",
        config.source, name_of(rl::kLossNames, config.train.loss), name_of(diffusion::kSdeNames, config.rollout.sde),
        name_of(rl::kStepStrategyNames, config.rollout.strategy));
}

void check_latent_grid(const config::Config& config, const models::Family& family) {
  const models::LatentGrid grid = latent_grid(config);
  try {
    family.latent_shape(1, grid);
  } catch (const Error& e) {
    fail("{}: the latent grid rollout.frames x rollout.height x rollout.width = {}x{}x{}: {}", config.source,
         grid.frames, grid.height, grid.width, e.what());
  }
}

void check_sequence_parallel(const config::Config& config, const models::Family& family) {
  try {
    family.check_sequence_parallel(config.parallel.sequence_parallel, latent_grid(config));
  } catch (const Error& e) {
    fail("{}: {}", config.source, e.what());
  }
}

StartedJob start_runtime(const config::Config& config, const std::string& out_dir) {
  // Deterministic runs pin their kernels and one thread per rank unless
  // run.threads says otherwise; the pin re-executes the process before MPI starts.
  const int threads = config.run.deterministic && config.run.threads == 0 ? 1 : static_cast<int>(config.run.threads);
  if (config.run.deterministic) pin_cpu_kernels(threads);
  std::unique_ptr<dist::Runtime> runtime = dist::Runtime::create(runtime_options(config));
  if (config.run.deterministic && runtime->device().is_cuda()) pin_gpu_kernels();
  refuse_staged_with_forbidden_sync(config, *runtime);
  // Locked before anything is written there, logs included.
  std::unique_ptr<io::OutDirLock> lock =
      out_dir.empty() ? nullptr : std::make_unique<io::OutDirLock>(out_dir, runtime->io_comm());
  dist::setup_logging(runtime->world(), out_dir, config.run.log_level);
  if (config.run.deterministic) warn_on_weaker_pins();
  if (keep_freed_host_memory())
    spdlog::debug("malloc: {}, mmap / trim thresholds 32 / 64 MiB", host_malloc_name());
  else if (tcmalloc_in_use())
    spdlog::debug("malloc: {}", host_malloc_name());
  else
    spdlog::debug("malloc: {}, its own thresholds (GLIBC_TUNABLES / MALLOC_*_ set, or mallopt refused ditrl's)",
                  host_malloc_name());
  at::set_num_threads(threads > 0 ? threads : runtime->default_threads());
  use_cpu_gemms(config, runtime->device());
  // Nothing draws from the default generator; seeding it makes the
  // checkpoints' /rng state a function of the deck too.
  at::manual_seed(static_cast<uint64_t>(config.run.seed));
  dist::log_placement(runtime->world(), at::get_num_threads(),
                      fmt::format("{} data {}", runtime->device().str(), dist::to_string(runtime->data_backend())),
                      runtime->io_comm());
  if (const std::string warning = dist::unused_gpu_warning(runtime->device(), config.run.device);
      !warning.empty() && runtime->world().rank == 0)
    spdlog::warn(warning);
  return {std::move(runtime), std::move(lock)};
}

Run open_run(const config::Config& config, dist::Runtime& runtime, const std::string& dump_dir) {
  Run run;
  run.config = config;
  run.deck_text = config::to_toml(config);
  run.runtime = &runtime;
  const config::Config& c = run.config;
  const int world = runtime.world().size;
  run.traits = rl::algorithm_traits(c.train.loss);
  check_run_inputs(c, world);
  {
    const std::shared_ptr<models::Family> meta = models::create_family(family_options(c, c10::kMeta));
    check_latent_grid(c, *meta);
    check_sequence_parallel(c, *meta);
  }
  check_memory_fits(c, runtime);

  const auto load_start = Clock::now();
  // The run's forwards are all at the deck's grid: SD3's pos_embed holds its crop only.
  SlicedModel model = sliced_deck_model(c, runtime.device(), GridTables::DeckCrop);
  const double build_s = seconds_since(load_start);
  run.family = std::move(model.family);
  const dist::SequenceGroups& sequence = runtime.sequence();
  if (sequence.layout().size > 1) run.ulysses = std::make_unique<models::Ulysses>(sequence.group());
  run.prompts = c.data.prompts.empty()
                    ? rollout::synthetic_prompts(run.family->cond_spec(), c.data.synthetic_prompts, c.data.seed)
                    : rollout::open_prompt_dataset(c.data.prompts, run.family->cond_spec());
  run.rewards = std::make_unique<rollout::RewardSet>(reward_options(c, runtime.device()), !c.rewards.empty(),
                                                     c.train.reward_combine);

  const models::LatentGrid grid = latent_grid(c);
  diffusion::Schedule schedule =
      models::family_schedule(c.model.family, {c.rollout.steps, c.rollout.shift, grid.frames, grid.height,
                                                grid.width, c.model.preset, c.model.config});
  const std::vector<int64_t> shape = run.family->latent_shape(1, grid);
  const std::vector<int64_t> latent_shape(shape.begin() + 1, shape.end());

  rollout::CollectOptions collect;
  collect.prompts_per_rollout = c.rollout.batch;
  collect.samples_per_prompt = c.rollout.samples_per_prompt;
  collect.seed = c.run.seed;
  collect.data_seed = c.data.seed;
  collect.keep_gathered = c.parallel.rollout_keep_gathered;
  collect.sampler = sampler_options(c);
  collect.strategy = strategy_options(c);
  collect.advantages = advantage_options(c);
  for (int64_t i = 0; i < schedule.steps(); ++i)
    collect.needs_negative |= models::uses_cfg(*run.family, collect.sampler.guidance, schedule.timestep(i));

  run.params =
      std::make_unique<shard::ShardedParams>(*run.family, run.family->wrap_units(), compiled_plan(c, *run.family),
                                             runtime.data(), shard_options(c, runtime.device()), model.source.get());
  log_load(c, *model.source, build_s, seconds_since(load_start));
  model.source.reset();  // the checkpoint files are not needed after loading
  collect.sampler.device = runtime.device();
  if (c.debug.dump) {
    run.dump = open_parity_dump(c, run.traits, runtime.world().rank, dump_dir);
    collect.sampler.dump = run.dump.get();
  }
  run.collector = std::make_unique<rollout::Collector>(
      collect,
      rollout::CollectParts{run.family.get(), run.params.get(), run.prompts.get(), run.rewards.get(),
                            &sequence.samples(), run.ulysses.get(), runtime.io_comm()},
      std::move(schedule), latent_shape);

  run.policy.family = run.family.get();
  run.policy.params = run.params.get();
  run.policy.kernel = collect.sampler.kernel;
  run.policy.guidance = collect.sampler.guidance;
  run.policy.needs_negative = collect.needs_negative;
  run.policy.microgroup = collect.sampler.microgroup;
  run.policy.dump = run.dump.get();
  run.policy.latent_shape = latent_shape;
  run.policy.ulysses = run.ulysses.get();
  run.policy.sample_rank = sequence.layout().data_rank;
  run.policy.sample_ranks = sequence.layout().data_size;
  run.algorithm = rl::make_algorithm(algorithm_options(c), run.policy);
  return run;
}

rl::TrainingRollout training_rollout(const rollout::RolloutBatch& batch) {
  const rollout::Trajectories& t = batch.trajectories;
  rl::TrainingRollout out;
  out.rollout_id = batch.rollout_id;
  out.view.latents = t.latents;
  out.view.latent_steps = t.steps.return_latents;
  out.view.log_probs = t.log_probs;
  out.view.sde_steps = t.steps.sde_steps;
  out.view.final_latents = t.final_latents;
  out.view.advantages = batch.advantages;
  out.view.sample_index = t.sample_index;
  out.view.snapshot = t.snapshot;
  out.prompt_index = t.prompt_index;
  out.model_outputs = t.model_outputs;
  out.cond = batch.cond;
  out.negative = batch.negative;
  return out;
}

io::TrainingState training_state(Run& run, bool with_extra) {
  const rl::ExtraState extra = with_extra ? run.algorithm->extra_state() : rl::ExtraState{};
  io::TrainingState state;
  state.device = run.params->device();
  for (const auto& [set, tensors] : extra) state.extra_sets.push_back(set);
  std::map<std::string, size_t> mine;  // trainable piece index by name
  std::vector<shard::ShardPiece> pieces;
  for (shard::ShardPiece& p : run.params->pieces())
    if (p.trainable) {
      mine[p.name] = pieces.size();
      pieces.push_back(std::move(p));
    }
  const shard::Layout& layout = run.params->layout();
  for (const shard::UnitLayout& unit : layout.units)
    for (const shard::FlatGroup& group : unit.groups) {
      if (!group.trainable) continue;
      for (const shard::Slot& slot : group.slots) {
        io::StateTensor t{slot.name, slot.shape, 0, 0, {}, {}, {}, {}};
        if (const auto it = mine.find(slot.name); it != mine.end()) {
          const shard::ShardPiece& p = pieces[it->second];
          t.begin = p.begin;
          t.end = p.end;
          t.master = p.master;
          t.exp_avg = p.exp_avg;
          t.exp_avg_sq = p.exp_avg_sq;
          for (const auto& [set, tensors] : extra) t.extra.push_back(tensors.at(it->second));
        }
        state.tensors.push_back(std::move(t));
      }
    }
  return state;
}

}  // namespace ditrl::app
