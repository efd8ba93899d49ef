#pragma once

// Supervised fine-tuning with the flow-matching velocity loss
// (docs/algorithms.md §5): per sample one grid step drawn from a seeded stream,
// the target latent corrupted at its sigma, MSE to the velocity
// noise - x0. Targets are [data] sft_latents rows (row = prompt index) or
// seeded synthetic latents per prompt. With two experts (Wan2.2 A14B) each
// micro-batch trains one expert.

#include <ditrl/io/h5.hpp>
#include <ditrl/rl/algorithm.hpp>

#include <memory>

namespace ditrl::rl {

class Sft final : public Algorithm {
 public:
  static constexpr int64_t kPairsPerSample = 1;  // each sample trains at one drawn sigma

  Sft(const AlgorithmOptions& options, const Policy& policy);

  const MetricSchema& metric_schema() const override { return schema_; }
  TrainData prepare(const TrainingRollout& rollout) override;
  at::Tensor micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                              size_t micro_batch_index, MetricBuffer& metrics) override;

 private:
  static constexpr int64_t kSigmaBuckets = 4;

  at::Tensor targets(const at::Tensor& prompt_index) const;

  AlgorithmOptions options_;
  Policy policy_;
  MetricSchema schema_;
  std::unique_ptr<io::h5::File> targets_file_;
};

}  // namespace ditrl::rl
