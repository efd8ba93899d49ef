// SFT: per-prompt targets, pairs, the velocity loss and its metrics.

#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/metrics.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/sft.hpp>
#include <ditrl/rl/sft_loss.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/ranges.h>

namespace ditrl::rl {

Sft::Sft(const AlgorithmOptions& options, const Policy& policy)
    : options_(options), policy_(policy), schema_(sft_metric_schema(kSigmaBuckets)) {
  if (!options_.sft_latents.empty())
    targets_file_ = std::make_unique<io::h5::File>(io::h5::File::open(options_.sft_latents));
}

at::Tensor Sft::targets(const at::Tensor& prompt_index) const {
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < prompt_index.size(0); ++i) {
    const int64_t prompt = prompt_index[i].item<int64_t>();
    if (targets_file_) {
      rows.push_back(targets_file_->open_dataset("latents").read_rows(prompt, 1, false)[0].to(at::kFloat));
    } else {
      at::Generator gen = at::detail::createCPUGenerator(stable_hash("sft_target", options_.data_seed, prompt));
      rows.push_back(at::randn(policy_.latent_shape, gen, at::TensorOptions().dtype(at::kFloat)).mul_(0.5));
    }
    if (rows.back().sizes() != at::IntArrayRef(policy_.latent_shape))
      fail("{}: /latents row {} has shape [{}], the model's latent is [{}]", options_.sft_latents, prompt,
           fmt::join(rows.back().sizes(), ", "), fmt::join(policy_.latent_shape, ", "));
  }
  return dist::host_to_device(at::stack(rows), policy_.params->device());
}

TrainData Sft::prepare(const TrainingRollout& rollout) {
  RolloutView view = rollout.view;
  view.final_latents = targets(rollout.prompt_index);
  // Wan2.2 A14B routes each grid step to one of its two experts.
  std::vector<size_t> expert_of_step;
  for (int64_t i = 0; i < view.snapshot->steps(); ++i)
    expert_of_step.push_back(policy_.family->expert_for(view.snapshot->timestep(i)));
  TrainData data;
  const SftRouting routing{options_.micro_batch, chunk_samples(kPairsPerSample, options_.micro_batch) * kPairsPerSample,
                           options_.steps_per_rollout};
  data.pairs = sft_pairs(view, kPairsPerSample, options_.seed, rollout.rollout_id, expert_of_step, routing);
  data.pairs_per_sample = kPairsPerSample;
  data.windows = optimizer_windows({static_cast<int64_t>(data.pairs.size()), routing.chunk_pairs, options_.micro_batch,
                                    options_.steps_per_rollout, policy_.sample_rank, policy_.sample_ranks});
  return data;
}

at::Tensor Sft::micro_batch_loss(const TrainingRollout& rollout, const TrainData& /*data*/, const PreparedBatch& b,
                                 size_t /*micro_batch_index*/, MetricBuffer& metrics) {
  const at::Tensor noise = pair_noise("sft_noise", options_.seed, rollout.rollout_id, b, policy_.latent_shape);
  const at::Tensor v = policy_.velocity(rollout, b, corrupt(b.latents, b.sigmas, noise), /*guided=*/false);
  const SftTerms terms = sft_loss(v, b.latents, noise);
  record_sft_metrics(metrics, terms, b.host_sigmas, kSigmaBuckets);
  return terms.loss_sum;
}

}  // namespace ditrl::rl
