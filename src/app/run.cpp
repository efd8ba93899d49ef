#include <ditrl/app/run.hpp>
#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/rl/advantages.hpp>
#include <ditrl/rl/stable_hash.hpp>
#include <ditrl/rollout/trajectory_file.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

namespace ditrl::app {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The batch knobs against the world size (algorithms.md §8).
void check_batching(const Run& run) {
  const config::Config& c = run.config;
  const int world = run.world.size;
  if (c.train.global_batch % world != 0)
    fail("{}: train.global_batch = {} is not divisible by the {} ranks", c.source, c.train.global_batch, world);
  if (c.train.loss == "grpo" && run.window_samples % c.train.micro_batch != 0)
    fail("{}: a rank's optimizer window holds {} samples (train.global_batch / ranks), which do not split into "
         "micro-batches of train.micro_batch = {} (GRPO micro-batches are rollout micro-groups)",
         c.source, run.window_samples, c.train.micro_batch);
}

models::FamilyOptions family_options(const config::Config& c, bool meta) {
  models::FamilyOptions o;
  o.family = c.model.family;
  o.preset = c.model.preset;
  o.config_json = c.model.config;
  o.experts = c.model.weights_2.empty() ? 0 : 2;  // a second expert checkpoint makes two experts
  o.meta = meta;
  o.init_seed = c.model.init_seed;
  o.attention = c.precision.attention;
  o.lora.enabled = c.model.lora.enabled;
  o.lora.rank = c.model.lora.rank;
  o.lora.alpha = c.model.lora.alpha;
  o.lora.targets = c.model.lora.targets;
  o.lora.init = c.model.lora.init;
  o.lora.seed = c.model.init_seed;
  o.inputs = precision::InputPolicy::resolve(c.precision.inputs.latents, c.precision.inputs.cond,
                                             c.precision.inputs.timestep, precision::parse_dtype(c.precision.forward));
  o.latent_grid = {c.rollout.frames, c.rollout.height, c.rollout.width, c.rollout.fps};
  return o;
}

// model.weights into the whole family, or with model.weights_2 the two
// expert checkpoints into their experts (Wan2.2 A14B: the diffusers folders
// transformer/ and transformer_2/, names without the expert prefix).
void load_family_weights(models::Family& family, const config::Config& c) {
  if (c.model.weights_2.empty()) {
    if (!c.model.weights.empty()) models::load_weights(family, io::Checkpoint(c.model.weights));
    return;
  }
  if (c.model.weights.empty())
    fail("{}: model.weights_2 (the low-noise expert) needs model.weights (the high-noise expert)", c.source);
  const std::vector<std::shared_ptr<torch::nn::Module>> experts = family.expert_modules();
  if (experts.size() != 2)
    fail("{}: model.weights_2 needs a family with two experts; {} has {}", c.source, family.family_name(),
         experts.size());
  models::load_weights(*experts[0], io::Checkpoint(c.model.weights));
  models::load_weights(*experts[1], io::Checkpoint(c.model.weights_2));
}

std::unique_ptr<shard::ShardedParams> shard_family(models::Family& family, const config::Config& c,
                                                   dist::Communicator& comm) {
  std::vector<precision::DtypeRule> family_rules;
  for (const models::DtypeOverride& rule : family.default_overrides())
    family_rules.push_back({rule.pattern, precision::parse_dtype(rule.dtype),
                            "family default \"" + rule.pattern + "\"", /*must_match=*/false});
  std::vector<std::string> names;
  for (const auto& item : family.named_parameters()) names.push_back(item.key());
  const precision::CompiledPlan plan =
      precision::PrecisionPlan::from_section(c.precision, std::move(family_rules)).compile(names);
  shard::ShardOptions options;
  options.reshard_after_forward = c.parallel.reshard_after_forward;
  options.prefetch = c.parallel.prefetch;
  options.adamw = {c.train.betas.at(0), c.train.betas.at(1), c.train.eps, c.train.weight_decay};
  return std::make_unique<shard::ShardedParams>(family, family.wrap_units(), plan, comm, options);
}

// Each rank writes its own samples' forwards to its own serial file, in
// OUT/debug or the folder the caller chose (a standalone rollout's own).
void open_parity_dump(Run& run, const std::string& dump_dir) {
  const config::Config& c = run.config;
  const std::filesystem::path dir =
      dump_dir.empty() ? std::filesystem::path(c.run.out_dir) / "debug" : std::filesystem::path(dump_dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / fmt::format("dump-rank{}.h5", run.world.rank)).string();
  run.dump =
      std::make_unique<rl::ParityDump>(path, rl::ParityDumpOptions{c.debug.rollouts, c.debug.samples, c.debug.steps});
  run.sampler.dump = run.dump.get();
  spdlog::info("[debug] dump: rollouts [{}], samples [{}], steps [{}] -> {}{}", fmt::join(c.debug.rollouts, ", "),
               fmt::join(c.debug.samples, ", "),
               c.debug.steps.empty() ? std::string("trained") : fmt::format("{}", fmt::join(c.debug.steps, ", ")), path,
               c.train.loss == "grpo" ? ""
                                      : " (rollout side only: the " + c.train.loss +
                                            " training forward runs on corrupted latents, not the rollout's)");
}

}  // namespace

Run open_run(const config::Config& config, const dist::MpiRuntime& mpi, const std::string& dump_dir) {
  Run run;
  run.config = config;
  run.deck_text = config::to_toml(config);
  run.world = mpi.world();
  const config::Config& c = run.config;

  run.samples_per_rollout = c.rollout.batch * c.rollout.samples_per_prompt;
  run.samples_per_rank = run.samples_per_rollout / run.world.size;
  run.window_samples = c.train.global_batch / run.world.size;
  check_batching(run);
  for (const auto& [key, path] : {std::pair<const char*, std::string>{"weights", c.model.weights},
                                  {"weights_2", c.model.weights_2},
                                  {"lora.weights", c.model.lora.weights}})
    if (!path.empty() && !std::filesystem::exists(path))
      fail("{}: model.{} = \"{}\": no such file", c.source, key, path);
  if (!c.data.prompts.empty() && !std::filesystem::exists(c.data.prompts))
    fail("{}: data.prompts = \"{}\": no such file", c.source, c.data.prompts);

  run.comm = dist::make_mpi_communicator(MPI_COMM_WORLD);
  run.family = models::create_family(family_options(c, /*meta=*/false));
  load_family_weights(*run.family, c);
  if (!c.model.lora.weights.empty())  // start from an existing PEFT / diffusers / LTX-2 adapter
    models::load_lora_adapter(*run.family, models::read_lora_file(c.model.lora.weights), c.model.lora.weights);

  run.prompts = c.data.prompts.empty()
                    ? rollout::synthetic_prompts(run.family->cond_spec(), c.data.synthetic_prompts, c.data.seed)
                    : rollout::open_prompt_dataset(c.data.prompts, run.family->cond_spec());

  rollout::RewardOptions reward;
  reward.kind = c.reward.kind;
  reward.analytic = c.reward.analytic;
  reward.module = c.reward.module;
  reward.command = c.reward.command;
  reward.target_seed = c.reward.target_seed;
  reward.timeout_s = c.reward.timeout_s;
  reward.work_dir = (std::filesystem::path(c.run.out_dir) / "reward").string();
  run.reward = rollout::make_reward(reward);

  const models::LatentGrid grid{c.rollout.frames, c.rollout.height, c.rollout.width, c.rollout.fps};
  run.schedule = diffusion::family_schedule(c.model.family, {c.rollout.steps, c.rollout.shift, grid.frames,
                                                              grid.height, grid.width});
  const std::vector<int64_t> shape = run.family->latent_shape(1, grid);
  run.latent_shape.assign(shape.begin() + 1, shape.end());

  // NFT and SFT sample with the ODE alone (algorithms.md §4.1).
  const bool pure_ode = c.train.loss != "grpo";
  run.sampler.kernel = {diffusion::parse_sde_type(c.rollout.sde), c.rollout.noise_level};
  run.sampler.guidance.scale = c.rollout.guidance_scale;
  run.sampler.guidance.scale_2 = c.rollout.guidance_scale_2;
  run.sampler.guidance.true_cfg_scale = c.rollout.true_cfg_scale;
  run.sampler.microgroup = c.rollout.microgroup > 0 ? c.rollout.microgroup : c.train.micro_batch;
  if (run.samples_per_rank % run.sampler.microgroup != 0)
    fail("{}: a rank's {} rollout samples do not split into micro-groups of {}", c.source, run.samples_per_rank,
         run.sampler.microgroup);
  run.strategy.strategy = pure_ode || c.rollout.sde == "ode" ? "ode_and_return_last" : c.rollout.strategy;
  run.strategy.num_steps = c.rollout.steps;
  run.strategy.sde_steps = c.rollout.sde_steps;
  run.strategy.window = c.rollout.window;
  run.strategy.candidate_steps = c.rollout.candidate_steps;
  run.strategy.rollout_seed = c.run.seed;
  run.strategy.rollout_batch_size = c.rollout.batch;
  for (int64_t i = 0; i < run.schedule.steps(); ++i)
    run.needs_negative |= models::uses_cfg(*run.family, run.sampler.guidance, run.schedule.timestep(i));

  run.params = shard_family(*run.family, c, *run.comm);
  if (c.debug.dump) open_parity_dump(run, dump_dir);
  return run;
}

namespace {

// Rewards (unless the trajectories carry them) and the advantages, which need
// every rank's rewards: groups may span ranks.
void score_and_normalise(Run& run, RolloutBatch& out) {
  const config::Config& c = run.config;
  rollout::Trajectories& t = out.trajectories;
  const auto start = std::chrono::steady_clock::now();
  if (!t.rewards.defined()) {
    std::vector<std::string> texts;
    for (int64_t i = 0; i < t.size(); ++i) texts.push_back(run.prompts->text(t.prompt_index[i].item<int64_t>()));
    t.rewards = run.reward->score(t.final_latents, t.prompt_index, texts).contiguous();
  }
  out.seconds_reward = seconds_since(start);
  out.all_rewards = at::empty({run.samples_per_rollout}, at::kFloat);
  run.comm->all_gather(t.rewards.to(at::kFloat).contiguous(), out.all_rewards);
  rl::AdvantageOptions a;
  a.group_size = c.rollout.samples_per_prompt;
  a.std_normalization = c.train.std_normalization;
  a.global_mean = c.train.global_mean;
  a.global_std = c.train.global_std;
  a.std_ddof = c.train.std_ddof;
  out.advantages = rl::group_advantages(out.all_rewards, a)
                       .narrow(0, run.world.rank * run.samples_per_rank, run.samples_per_rank)
                       .contiguous();
}

}  // namespace

RolloutBatch collect_rollout(Run& run, int64_t rollout_id) {
  const config::Config& c = run.config;
  const int64_t g = c.rollout.samples_per_prompt;
  const int64_t first = run.world.rank * run.samples_per_rank;
  const std::vector<int64_t> prompts =
      rollout::rollout_prompts(run.prompts->size(), c.data.seed, rollout_id, c.rollout.batch);

  RolloutBatch out;
  out.rollout_id = rollout_id;
  rollout::SampleBatch batch;
  std::vector<int64_t> rows, samples;
  for (int64_t s = first; s < first + run.samples_per_rank; ++s) {
    rows.push_back(prompts[static_cast<size_t>(s / g)]);
    samples.push_back(s);
    batch.seeds.push_back(rl::stable_hash("rollout_noise", c.run.seed, rollout_id, s));
  }
  batch.cond = run.prompts->fetch(rows);
  if (run.needs_negative) out.negative = run.prompts->negative(run.samples_per_rank);
  batch.negative = run.needs_negative ? &out.negative : nullptr;
  batch.prompt_index = at::tensor(rows, at::kLong);
  batch.sample_index = at::tensor(samples, at::kLong);
  batch.latent_shape = run.latent_shape;
  batch.rollout_id = rollout_id;

  // Every sample of a rollout shares its SDE steps, drawn per rollout.
  const rl::StepSelection steps = rl::select_steps(
      run.strategy, {rl::stable_hash("sde_window", c.run.seed, rollout_id), rollout_id * c.rollout.batch});

  auto start = std::chrono::steady_clock::now();
  {
    const shard::KeepGathered keep(*run.params, c.parallel.rollout_keep_gathered);
    run.params->begin_step();
    out.trajectories = rollout::sample(*run.family, run.forward_context(), run.schedule, steps, batch, run.sampler);
  }
  out.seconds_sampling = seconds_since(start);

  out.cond = std::move(batch.cond);
  score_and_normalise(run, out);
  return out;
}

RolloutBatch load_rollout(Run& run, const std::string& path, int64_t rollout_id) {
  rollout::TrajectoryExpectation expect{run.latent_shape, run.family->cond_spec(), run.samples_per_rollout};
  rollout::TrajectoryRecord record =
      rollout::read_trajectories(path, run.world.rank * run.samples_per_rank, run.samples_per_rank, expect);
  RolloutBatch out;
  out.rollout_id = rollout_id;
  out.trajectories = std::move(record.trajectories);
  out.cond = std::move(record.cond);
  out.negative = std::move(record.negative);
  if (run.needs_negative && out.negative.tensors.empty())
    out.negative = run.prompts->negative(run.samples_per_rank);
  if (run.config.train.loss == "grpo" && run.sampler.microgroup > 1 && !out.trajectories.model_outputs.defined())
    spdlog::warn("trajectories {}: no /model_outputs; train/model_output_* metrics are not reported", path);
  score_and_normalise(run, out);
  return out;
}

void save_rollout(const Run& run, const RolloutBatch& batch, const std::string& path) {
  rollout::TrajectoryRecord record{batch.trajectories, batch.cond, batch.negative, {}, {}};
  record.text_attrs = {{"family", run.config.model.family}, {"sde", run.config.rollout.sde},
                       {"deck", run.deck_text}};
  record.number_attrs = {{"noise_level", run.config.rollout.noise_level},
                         {"guidance_scale", run.config.rollout.guidance_scale},
                         {"rollout_id", static_cast<double>(batch.rollout_id)}};
  rollout::write_trajectories(path, record, run.world.rank * run.samples_per_rank, run.samples_per_rollout,
                              MPI_COMM_WORLD);
}

}  // namespace ditrl::app
