// The algorithm factory: with rl/algorithm_traits.hpp the one place that looks at the loss.

#include <ditrl/error.hpp>
#include <ditrl/rl/algorithm.hpp>
#include <ditrl/rl/grpo.hpp>
#include <ditrl/rl/nft.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/sft.hpp>

namespace ditrl::rl {

std::vector<TrainPair> TrainData::slice(const MicroBatch& mb) const {
  return {pairs.begin() + mb.begin, pairs.begin() + mb.end};
}

std::vector<MicroBatch> TrainData::micro_batches() const {
  std::vector<MicroBatch> out;
  for (const OptimizerWindow& w : windows) out.insert(out.end(), w.micro_batches.begin(), w.micro_batches.end());
  return out;
}

int64_t chunk_pairs_per_sample(Loss loss, int64_t steps, double timestep_fraction) {
  switch (loss) {
    case Loss::Nft:
      return nft_pairs_per_sample(steps, timestep_fraction);
    case Loss::Sft:
      return Sft::kPairsPerSample;
    case Loss::Grpo:
      break;
  }
  fail("train.loss = \"{}\": its micro-batches are rollout micro-groups, not chunks of samples",
       name_of(kLossNames, loss));
}

std::unique_ptr<Algorithm> make_algorithm(const AlgorithmOptions& options, const Policy& policy) {
  switch (options.loss) {
    case Loss::Grpo:
      return std::make_unique<Grpo>(options, policy);
    case Loss::Nft:
      return std::make_unique<Nft>(options, policy);
    case Loss::Sft:
      return std::make_unique<Sft>(options, policy);
  }
  fail("train.loss: no algorithm for value {}", static_cast<int>(options.loss));
}

}  // namespace ditrl::rl
