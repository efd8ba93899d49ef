// The deck -> subsystem options translation.

#include <ditrl/app/options.hpp>
#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>

#include <fmt/format.h>

#include <filesystem>

namespace ditrl::app {

dist::RuntimeOptions runtime_options(const config::Config& c) {
  dist::RuntimeOptions o;
  o.device = c.run.device;
  o.deterministic = c.run.deterministic;
  o.startup_timeout_s = c.parallel.startup_timeout_s;
  o.collective_timeout_s = c.parallel.collective_timeout_s;
  o.sequence_parallel = static_cast<int>(c.parallel.sequence_parallel);
  o.data_backend = data_backend(c.parallel.data_backend);
  return o;
}

dist::DataBackend data_backend(const std::string& name) {
  if (name == "auto") return dist::DataBackend::Auto;
  if (name == "nccl") return dist::DataBackend::Nccl;
  if (name == "mpi") return dist::DataBackend::Mpi;
  fail("parallel.data_backend = \"{}\": expected \"auto\", \"nccl\" or \"mpi\"", name);
}

models::LatentGrid latent_grid(const config::Config& c) {
  return {c.rollout.frames, c.rollout.height, c.rollout.width, c.rollout.fps};
}

models::FamilyOptions family_options(const config::Config& c, c10::Device device) {
  models::FamilyOptions o;
  o.family = c.model.family;
  o.preset = c.model.preset;
  o.config_json = c.model.config;
  o.experts = c.model.weights_2.empty() ? 0 : 2;  // a second expert checkpoint makes two experts
  o.device = device;
  o.init_seed = c.model.init_seed;
  o.attention = c.precision.attention;
  o.lora.enabled = c.model.lora.enabled;
  o.lora.rank = c.model.lora.rank;
  o.lora.alpha = c.model.lora.alpha;
  o.lora.targets = c.model.lora.targets;
  o.lora.init = c.model.lora.init;
  o.lora.seed = c.model.init_seed;
  o.inputs = precision::InputPolicy::resolve(c.precision.inputs.latents, c.precision.inputs.cond,
                                             c.precision.inputs.timestep, c.precision.forward);
  o.latent_grid = latent_grid(c);
  return o;
}

precision::PrecisionPlan precision_plan(const config::Config& c,
                                        const std::vector<precision::DtypeRule>& family_rules) {
  const config::PrecisionSection& p = c.precision;
  std::vector<precision::DtypeRule> rules;
  if (p.family_overrides) rules = family_rules;
  for (size_t i = 0; i < p.overrides.size(); ++i)
    rules.push_back({p.overrides[i].pattern, p.overrides[i].dtype,
                     fmt::format("precision.override[{}] \"{}\"", i, p.overrides[i].pattern), /*must_match=*/true});
  return precision::PrecisionPlan(p.master, p.reduce, p.forward, std::move(rules));
}

precision::CompiledPlan compiled_plan(const config::Config& c, models::Family& family) {
  std::vector<precision::DtypeRule> family_rules;
  for (const models::DtypeOverride& rule : family.default_overrides())
    family_rules.push_back({rule.pattern, rule.dtype, "family default \"" + rule.pattern + "\"", /*must_match=*/false});
  std::vector<std::string> names;
  for (const auto& item : family.named_parameters()) names.push_back(item.key());
  return precision_plan(c, family_rules).compile(names);
}

shard::ShardOptions shard_options(const config::Config& c, c10::Device device) {
  if (c.train.betas.size() != 2)
    fail("{}: train.betas must have two entries [beta1, beta2] (got {})", c.source, c.train.betas.size());
  shard::ShardOptions o;
  o.reshard_after_forward = c.parallel.reshard_after_forward;
  o.canonical_sum = c.run.deterministic && c.run.rank_invariant;
  o.prefetch = c.parallel.prefetch;
  o.recompute = c.parallel.recompute;
  o.device = device;
  o.adamw = {c.train.betas[0], c.train.betas[1], c.train.eps, c.train.weight_decay, c.train.fused_adamw};
  return o;
}

std::vector<rollout::RewardOptions> reward_options(const config::Config& c, c10::Device device) {
  std::vector<rollout::RewardOptions> out;
  for (const config::RewardSection& r : config::reward_list(c)) {
    rollout::RewardOptions o;
    if (!r.name.empty()) o.name = r.name;
    o.kind = r.kind;
    o.weight = r.weight;
    o.analytic = r.analytic;
    o.module = r.module;
    o.command = r.command;
    o.target_seed = r.target_seed;
    o.timeout_s = r.timeout_s;
    o.work_dir = (std::filesystem::path(c.run.out_dir) / "reward").string();
    o.device = device;
    o.url = r.url;
    o.input = r.input;
    o.decoder = r.decoder;
    o.batch_size = r.batch_size;
    o.retries = r.retries;
    o.backoff_s = r.backoff_s;
    o.family = c.model.family;
    out.push_back(std::move(o));
  }
  return out;
}

rollout::SamplerOptions sampler_options(const config::Config& c) {
  rollout::SamplerOptions o;
  o.kernel = {c.rollout.sde, c.rollout.noise_level};
  o.guidance.scale = c.rollout.guidance_scale;
  o.guidance.scale_2 = c.rollout.guidance_scale_2;
  o.guidance.true_cfg_scale = c.rollout.true_cfg_scale;
  o.microgroup = c.rollout.microgroup > 0 ? c.rollout.microgroup : c.train.micro_batch;
  return o;
}

int64_t training_micro_batch(const config::Config& c) {
  return rl::algorithm_traits(c.train.loss).microgroup_batches ? sampler_options(c).microgroup : c.train.micro_batch;
}

rl::StepStrategyOptions strategy_options(const config::Config& c) {
  rl::StepStrategyOptions o;
  // Algorithms that train on no SDE transition sample with the ODE alone (docs/algorithms.md §4.1).
  const bool ode = !rl::algorithm_traits(c.train.loss).sde_rollout || c.rollout.sde == diffusion::SdeType::Ode;
  o.strategy = ode ? rl::StepStrategy::OdeAndReturnLast : c.rollout.strategy;
  o.num_steps = c.rollout.steps;
  o.sde_steps = c.rollout.sde_steps;
  o.window = c.rollout.window;
  o.candidate_steps = c.rollout.candidate_steps;
  o.rollout_seed = c.run.seed;
  o.rollout_batch_size = c.rollout.batch;
  return o;
}

rl::AdvantageOptions advantage_options(const config::Config& c) {
  rl::AdvantageOptions o;
  o.group_size = c.rollout.samples_per_prompt;
  o.std_normalization = c.train.std_normalization;
  o.global_mean = c.train.global_mean;
  o.global_std = c.train.global_std;
  o.std_ddof = c.train.std_ddof;
  return o;
}

rl::AlgorithmOptions algorithm_options(const config::Config& c) {
  rl::AlgorithmOptions o;
  o.loss = c.train.loss;
  o.seed = c.run.seed;
  o.steps_per_rollout = c.train.steps_per_rollout;
  o.micro_batch = c.train.micro_batch;
  o.lora = c.model.lora.enabled;
  o.clip_range = c.train.clip_range;
  o.adv_clip_max = c.train.adv_clip_max;
  o.kl_beta = c.train.kl_beta;
  o.timestep_fraction = c.rollout.timestep_fraction;
  o.nft_beta = c.train.nft_beta;
  o.nft_adaptive = c.train.nft_adaptive;
  o.nft_shuffle_timesteps = c.train.nft_shuffle_timesteps;
  o.sft_latents = c.data.sft_latents;
  o.data_seed = c.data.seed;
  return o;
}

namespace {

// model.weights for the whole family, or with model.weights_2 the two expert
// checkpoints for their experts (Wan2.2 A14B: the diffusers folders
// transformer/ and transformer_2/, names without the expert prefix).
std::vector<models::CheckpointPart> weight_parts(const std::shared_ptr<models::Family>& family,
                                                 const config::Config& c) {
  if (c.model.weights_2.empty()) {
    if (c.model.weights.empty()) return {};
    return {{family, c.model.weights}};
  }
  if (c.model.weights.empty())
    fail("{}: model.weights_2 (the low-noise expert) needs model.weights (the high-noise expert)", c.source);
  const std::vector<std::shared_ptr<torch::nn::Module>> experts = family->expert_modules();
  if (experts.size() != 2)
    fail("{}: model.weights_2 needs a family with two experts; {} has {}", c.source, family->family_name(),
         experts.size());
  return {{experts[0], c.model.weights}, {experts[1], c.model.weights_2}};
}

// Those checkpoints into the (materialised) family.
void load_deck_weights(const std::shared_ptr<models::Family>& family, const config::Config& c) {
  for (const models::CheckpointPart& part : weight_parts(family, c))
    models::load_weights(*part.module, models::open_checkpoint(*part.module, part.path));
}

// Starts from an existing PEFT / diffusers / LTX-2 adapter (model.lora.weights).
void load_deck_lora(models::Family& family, const config::Config& c) {
  if (!c.model.lora.weights.empty())
    models::load_lora_adapter(family, models::read_lora_file(c.model.lora.weights), c.model.lora.weights);
}

}  // namespace

std::shared_ptr<models::Family> deck_model(const config::Config& c, c10::Device device) {
  std::shared_ptr<models::Family> family = models::create_family(family_options(c, device));
  load_deck_weights(family, c);
  load_deck_lora(*family, c);
  return family;
}

SlicedModel sliced_deck_model(const config::Config& c, c10::Device device, GridTables tables) {
  models::FamilyOptions options = family_options(c, device);
  options.sliced = true;
  options.crop_to_grid = tables == GridTables::DeckCrop;
  SlicedModel out;
  out.family = models::create_family(options);
  const std::vector<models::CheckpointPart> parts = weight_parts(out.family, c);
  out.source = parts.empty() ? models::seeded_source(*out.family, c.model.init_seed)
                             : models::checkpoint_source(*out.family, parts);
  load_deck_lora(*out.family, c);
  return out;
}

rl::LrSchedule lr_schedule(const config::Config& c) {
  return {c.train.lr_schedule, c.train.lr, c.train.warmup, c.train.num_rollouts * c.train.steps_per_rollout};
}

}  // namespace ditrl::app
