#pragma once

// DiffusionNFT (docs/algorithms.md §4): the rollout samples with the ODE; each
// sample's final latent is corrupted at K sigmas, and the loss pulls the
// velocity toward the old (EMA) policy's positive or negative side by the
// sample's reward weight. The EMA shadow is updated once per rollout and
// saved in checkpoints as /extra/ema.

#include <ditrl/rl/algorithm.hpp>

namespace ditrl::rl {

class Nft final : public Algorithm {
 public:
  Nft(const AlgorithmOptions& options, const Policy& policy);

  const MetricSchema& metric_schema() const override { return schema_; }
  TrainData prepare(const TrainingRollout& rollout) override;
  at::Tensor micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                              size_t micro_batch_index, MetricBuffer& metrics) override;
  void end_rollout() override { old_policy_.update(); }
  ExtraState extra_state() override { return {{"ema", old_policy_.shadow()}}; }
  // The EMA decay depends on how many updates (one per rollout) happened.
  void resumed(int64_t rollouts_done) override { old_policy_.set_step(rollouts_done); }

 private:
  at::Tensor corrupted(const TrainingRollout& rollout, const PreparedBatch& b) const;

  AlgorithmOptions options_;
  Policy policy_;
  MetricSchema schema_;
  EmaShadow old_policy_;
};

}  // namespace ditrl::rl
