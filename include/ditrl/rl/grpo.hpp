#pragma once

// Flow-GRPO (docs/algorithms.md §3): pairs are the rollout's SDE transitions in
// micro-group order, so each training forward repeats one rollout forward;
// the loss is the clipped PPO objective on the kernel's log-prob, with an
// optional KL to a reference (the LoRA base, or the initial weights kept as
// a shadow) whose transition means are computed once per rollout.

#include <ditrl/rl/algorithm.hpp>

#include <memory>

namespace ditrl::rl {

class Grpo final : public Algorithm {
 public:
  Grpo(const AlgorithmOptions& options, const Policy& policy);

  const MetricSchema& metric_schema() const override { return schema_; }
  TrainData prepare(const TrainingRollout& rollout) override;
  at::Tensor micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                              size_t micro_batch_index, MetricBuffer& metrics) override;
  ExtraState extra_state() override;

 private:
  std::vector<at::Tensor> reference_means(const TrainingRollout& rollout, const TrainData& data);

  AlgorithmOptions options_;
  Policy policy_;
  MetricSchema schema_;
  std::unique_ptr<EmaShadow> reference_;  // the initial weights, when the KL reference is not the LoRA base
};

}  // namespace ditrl::rl
