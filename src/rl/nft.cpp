// DiffusionNFT: pairs, the EMA old policy pass, the NFT loss and its metrics.

#include <ditrl/rl/metrics.hpp>
#include <ditrl/rl/nft.hpp>
#include <ditrl/rl/nft_loss.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace ditrl::rl {

Nft::Nft(const AlgorithmOptions& options, const Policy& policy)
    : options_(options),
      policy_(policy),
      schema_(nft_metric_schema()),
      old_policy_(trainable_masters(*policy.params), EmaOptions{}) {}

at::Tensor Nft::corrupted(const TrainingRollout& rollout, const PreparedBatch& b) const {
  return corrupt(b.latents, b.sigmas,
                 pair_noise("nft_corrupt", options_.seed, rollout.rollout_id, b, policy_.latent_shape));
}

TrainData Nft::prepare(const TrainingRollout& rollout) {
  TrainData data;
  data.pairs = nft_pairs(rollout.view, options_.timestep_fraction, options_.nft_shuffle_timesteps, options_.seed);
  data.pairs_per_sample = static_cast<int64_t>(data.pairs.size()) / rollout.view.sample_index.size(0);
  data.windows = optimizer_windows({static_cast<int64_t>(data.pairs.size()),
                                    chunk_samples(data.pairs_per_sample, options_.micro_batch) * data.pairs_per_sample,
                                    options_.micro_batch, options_.steps_per_rollout, policy_.params->rank(),
                                    policy_.params->world_size()});
  // The old policy's velocity on each pair's corrupted latent.
  torch::NoGradGuard no_grad;
  ShadowScope scope(old_policy_, *policy_.params);
  policy_.params->begin_step();
  for (const MicroBatch& mb : data.micro_batches()) {
    const PreparedBatch b = prepare_batch(data.slice(mb), policy_.params->device());
    data.reference.push_back(policy_.velocity(rollout, b, corrupted(rollout, b), /*guided=*/false));
  }
  return data;
}

at::Tensor Nft::micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                                 size_t micro_batch_index, MetricBuffer& metrics) {
  const at::Tensor x_t = corrupted(rollout, b);
  const at::Tensor v = policy_.velocity(rollout, b, x_t, /*guided=*/false);
  const NftTerms terms = nft_loss(v, data.reference.at(micro_batch_index), b.latents, x_t, b.sigmas, b.advantages,
                                  {options_.nft_beta, options_.adv_clip_max, options_.nft_adaptive});
  record_nft_metrics(metrics, terms, b.advantages, b.sigmas, data.pairs_per_sample);
  return terms.loss_sum;
}

}  // namespace ditrl::rl
