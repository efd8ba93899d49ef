// Collector: a rank's share of a rollout sampled or read, scored, turned into advantages.

#include <ditrl/dist/log.hpp>
#include <ditrl/dist/phase_timer.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/ulysses.hpp>
#include <ditrl/rl/metrics.hpp>
#include <ditrl/rl/stable_hash.hpp>
#include <ditrl/rollout/collect.hpp>
#include <ditrl/rollout/trajectory_file.hpp>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

namespace ditrl::rollout {

Collector::Collector(const CollectOptions& options, const CollectParts& parts, diffusion::Schedule schedule,
                     std::vector<int64_t> latent_shape)
    : options_(options), parts_(parts), schedule_(std::move(schedule)), latent_shape_(std::move(latent_shape)) {}

RolloutBatch Collector::collect(int64_t rollout_id) {
  const int64_t g = options_.samples_per_prompt;
  const int64_t first = parts_.comm->rank() * samples_per_rank();
  const std::vector<int64_t> prompts =
      rollout_prompts(parts_.prompts->size(), options_.data_seed, rollout_id, options_.prompts_per_rollout);

  RolloutBatch out;
  out.rollout_id = rollout_id;
  SampleBatch batch;
  std::vector<int64_t> rows, samples;
  for (int64_t s = first; s < first + samples_per_rank(); ++s) {
    rows.push_back(prompts[static_cast<size_t>(s / g)]);
    samples.push_back(s);
    batch.seeds.push_back(rl::stable_hash("rollout_noise", options_.seed, rollout_id, s));
  }
  const c10::Device device = parts_.params->device();
  batch.cond = parts_.prompts->fetch(rows).to(device);
  if (options_.needs_negative) out.negative = parts_.prompts->negative(samples_per_rank()).to(device);
  batch.negative = options_.needs_negative ? &out.negative : nullptr;
  batch.prompt_index = at::tensor(rows, at::kLong);
  batch.sample_index = at::tensor(samples, at::kLong);
  batch.latent_shape = latent_shape_;
  batch.rollout_id = rollout_id;

  // Every sample of a rollout shares its SDE steps, drawn per rollout.
  const rl::StepSelection steps = rl::select_steps(
      options_.strategy,
      {rl::stable_hash("sde_window", options_.seed, rollout_id), rollout_id * options_.prompts_per_rollout});

  // A reward server scores each micro-group while the next one samples.
  parts_.rewards->begin_rollout(rollout_id);
  SamplerOptions sampler = options_.sampler;
  const std::vector<std::string> prompts_text = texts(batch.prompt_index);
  if (parts_.rewards->overlaps_sampling())
    sampler.after_microgroup = [&](int64_t begin, const at::Tensor& final_latents) {
      const int64_t m = final_latents.size(0);
      parts_.rewards->start(final_latents, batch.prompt_index.narrow(0, begin, m),
                            {prompts_text.begin() + begin, prompts_text.begin() + begin + m});
    };
  dist::PhaseTimer sampling(parts_.params->device());
  {
    const dist::TimedScope timed(sampling);
    const shard::KeepGathered keep(*parts_.params, options_.keep_gathered);
    parts_.params->begin_step();
    out.trajectories =
        sample(*parts_.family, {parts_.params, nullptr, parts_.ulysses}, schedule_, steps, batch, sampler);
  }
  out.seconds_sampling = sampling.seconds();
  // Once per process: the peak so far is the load's or this rollout's
  // (`ditrl plan` predicts both; the run's whole peak is perf/peak_rss_bytes).
  if (!memory_logged_) spdlog::info("[memory] after sampling rollout {}: {}", rollout_id, dist::memory_text());
  memory_logged_ = true;

  out.cond = std::move(batch.cond);
  score_and_normalise(out);
  return out;
}

RolloutBatch Collector::load(const std::string& path, int64_t rollout_id) {
  TrajectoryExpectation expect{latent_shape_, parts_.family->cond_spec(), samples_per_rollout(),
                               parts_.rewards->several() ? parts_.rewards->names() : std::vector<std::string>{}};
  TrajectoryRecord record =
      read_trajectories(path, parts_.comm->rank() * samples_per_rank(), samples_per_rank(), expect);
  RolloutBatch out;
  out.rollout_id = rollout_id;
  const c10::Device device = parts_.params->device();
  out.trajectories = to_device(std::move(record.trajectories), device);
  out.cond = record.cond.to(device);
  out.negative = record.negative.to(device);
  parts_.rewards->begin_rollout(rollout_id);
  if (options_.needs_negative && out.negative.tensors.empty())
    out.negative = parts_.prompts->negative(samples_per_rank()).to(device);
  score_and_normalise(out);
  return out;
}

void Collector::save(const RolloutBatch& batch, const std::string& path,
                     const std::map<std::string, std::string>& text_attrs,
                     const std::map<std::string, double>& number_attrs) const {
  // The ranks of a sequence-parallel group hold the same samples; one
  // collective writer per row is what the file format has.
  if (parts_.ulysses)
    fail("writing trajectories with parallel.sequence_parallel = {} is not supported; write them at 1",
         parts_.ulysses->size());
  TrajectoryRecord record{batch.trajectories, batch.cond, batch.negative, parts_.rewards->names(),
                          batch.advantages,   text_attrs, number_attrs};
  write_trajectories(path, record, parts_.comm->rank() * samples_per_rank(), samples_per_rollout(), parts_.io_comm);
}

std::vector<std::string> Collector::texts(const at::Tensor& prompt_index) const {
  std::vector<std::string> out;
  const at::Tensor rows = prompt_index.to(at::kLong).contiguous();
  for (int64_t i = 0; i < rows.numel(); ++i) out.push_back(parts_.prompts->text(rows.data_ptr<int64_t>()[i]));
  return out;
}

// Rewards (unless the trajectories carry them) and the advantages, which need
// every rank's rewards.
void Collector::score_and_normalise(RolloutBatch& out) {
  Trajectories& t = out.trajectories;
  RewardSet& rewards = *parts_.rewards;
  dist::PhaseTimer reward(parts_.params->device());
  if (!t.rewards.defined()) {
    const dist::TimedScope timed(reward);
    const at::Tensor values = rewards.finish(t.final_latents, t.prompt_index, texts(t.prompt_index));
    t.rewards = rewards.weighted_sum(values);
    if (rewards.several()) t.reward_values = values;
  }
  out.seconds_reward = reward.seconds();
  const at::TensorOptions on_device = at::TensorOptions().dtype(at::kFloat).device(parts_.params->device());
  out.all_rewards = at::empty({samples_per_rollout()}, on_device);
  parts_.comm->all_gather(t.rewards.to(on_device).contiguous(), out.all_rewards);
  at::Tensor all_advantages;
  if (t.reward_values.defined()) {
    out.all_reward_values = at::empty({samples_per_rollout(), rewards.size()}, on_device);
    parts_.comm->all_gather(t.reward_values.to(on_device).contiguous(), out.all_reward_values);
    all_advantages = rewards.advantages(out.all_reward_values, options_.advantages);
  } else {
    if (rewards.several() && rewards.combine() == RewardCombine::NormalizedSum)
      fail(
          "rollout {}: train.reward_combine = \"normalized_sum\" needs each reward's values, and the trajectories "
          "have /rewards but no /reward_values",
          out.rollout_id);
    all_advantages = rl::group_advantages(out.all_rewards, options_.advantages);
  }
  out.advantages = all_advantages.narrow(0, parts_.comm->rank() * samples_per_rank(), samples_per_rank()).contiguous();
}

std::map<std::string, double> Collector::metrics(const RolloutBatch& batch) const {
  std::map<std::string, double> row;
  for (const auto& [key, value] : rl::reward_stats(batch.all_rewards, options_.samples_per_prompt))
    row["rollout/reward/" + key] = value;
  if (batch.all_reward_values.defined()) {
    const std::vector<std::string> names = parts_.rewards->names();
    for (size_t k = 0; k < names.size(); ++k)
      for (const auto& [key, value] : rl::reward_stats(
               batch.all_reward_values.select(1, static_cast<int64_t>(k)).contiguous(), options_.samples_per_prompt))
        row["rollout/reward/" + names[k] + "/" + key] = value;
  }
  at::Tensor all_advantages = at::empty({samples_per_rollout()}, batch.advantages.options());
  parts_.comm->all_gather(batch.advantages, all_advantages);
  for (const auto& [key, value] : rl::advantage_stats(all_advantages)) row["rollout/reward/" + key] = value;
  row["rollout/step"] = static_cast<double>(batch.rollout_id);
  return row;
}

}  // namespace ditrl::rollout
