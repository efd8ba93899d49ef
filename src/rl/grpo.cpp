// Flow-GRPO: pairs, KL reference pass, clipped PPO loss and its metrics.

#include <ditrl/error.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/rl/grpo.hpp>
#include <ditrl/rl/grpo_loss.hpp>
#include <ditrl/rl/metrics.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

namespace ditrl::rl {

namespace {

// The rollout's velocity for each pair (its sample at its step).
at::Tensor rollout_outputs(const TrainingRollout& rollout, const PreparedBatch& b) {
  const std::vector<int64_t>& sde_steps = rollout.view.sde_steps;
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t step = b.step_indices[i].item<int64_t>();
    const auto it = std::find(sde_steps.begin(), sde_steps.end(), step);
    if (it == sde_steps.end()) fail("rollout {}: no model output for SDE step {}", rollout.rollout_id, step);
    const int64_t slot = it - sde_steps.begin();
    rows.push_back(rollout.model_outputs[b.prompt_indices[i].item<int64_t>()][slot]);
  }
  return at::stack(rows);
}

}  // namespace

Grpo::Grpo(const AlgorithmOptions& options, const Policy& policy)
    : options_(options), policy_(policy), schema_(grpo_metric_schema()) {
  if (options_.kl_beta > 0 && !options_.lora)
    reference_ = std::make_unique<EmaShadow>(trainable_masters(*policy_.params), EmaOptions{});
}

TrainData Grpo::prepare(const TrainingRollout& rollout) {
  TrainData data;
  data.pairs = grpo_pairs(rollout.view, policy_.microgroup);
  data.pairs_per_sample = static_cast<int64_t>(rollout.view.sde_steps.size());
  // A chunk is one rollout micro-group: each of its trained steps one micro-batch.
  data.windows = optimizer_windows({static_cast<int64_t>(data.pairs.size()), policy_.microgroup * data.pairs_per_sample,
                                    policy_.microgroup, options_.steps_per_rollout, policy_.params->rank(),
                                    policy_.params->world_size()});
  if (options_.kl_beta > 0) data.reference = reference_means(rollout, data);
  return data;
}

// The transition mean under the reference weights, computed once per
// rollout before any update, which is what a reference forward inside the
// step would give.
std::vector<at::Tensor> Grpo::reference_means(const TrainingRollout& rollout, const TrainData& data) {
  torch::NoGradGuard no_grad;
  std::unique_ptr<models::LoraDisableGuard> base;
  std::unique_ptr<ShadowScope> scope;
  if (reference_)
    scope = std::make_unique<ShadowScope>(*reference_, *policy_.params);
  else
    base = std::make_unique<models::LoraDisableGuard>();
  std::vector<at::Tensor> out;
  policy_.params->begin_step();
  for (const MicroBatch& mb : data.micro_batches()) {
    const PreparedBatch b = prepare_batch(data.slice(mb), policy_.params->device());
    const at::Tensor v = policy_.velocity(rollout, b, b.latents, /*guided=*/true);
    out.push_back(
        diffusion::sde_step(policy_.kernel, v, b.latents, b.step_sigmas(), diffusion::StepTarget::score(b.next_latents))
            .mean);
  }
  return out;
}

at::Tensor Grpo::micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                                  size_t micro_batch_index, MetricBuffer& metrics) {
  const std::unique_ptr<models::Tap> tap = policy_.train_tap(rollout.rollout_id, b);
  models::ForwardContext ctx = policy_.context();
  if (tap) ctx.tap = tap.get();
  const at::Tensor v = policy_.velocity(rollout, b, b.latents, /*guided=*/true, ctx);
  const diffusion::StepResult r =
      diffusion::sde_step(policy_.kernel, v, b.latents, b.step_sigmas(), diffusion::StepTarget::score(b.next_latents));
  record_sde_step(ctx, r);
  const GrpoOptions o{options_.clip_range, options_.adv_clip_max, options_.kl_beta};
  std::unique_ptr<KlInputs> kl;
  if (o.kl_beta > 0)
    kl = std::make_unique<KlInputs>(KlInputs{r.mean, data.reference.at(micro_batch_index), r.std_dev_t});
  const GrpoTerms terms = grpo_loss(r.log_prob, b.log_prob_old, b.advantages, o, kl.get());
  record_grpo_metrics(metrics, terms, r.log_prob, b.log_prob_old, o.clip_range);
  if (rollout.model_outputs.defined())
    record_model_output_diff(metrics, v.detach().to(at::kFloat), rollout_outputs(rollout, b));
  return terms.loss_sum;
}

ExtraState Grpo::extra_state() {
  if (!reference_) return {};
  return {{"reference", reference_->shadow()}};
}

}  // namespace ditrl::rl
