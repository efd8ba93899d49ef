// The algorithm factory and traits: the one place that reads the loss name.

#include <ditrl/error.hpp>
#include <ditrl/rl/algorithm.hpp>
#include <ditrl/rl/grpo.hpp>
#include <ditrl/rl/nft.hpp>
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

AlgorithmTraits algorithm_traits(const std::string& loss) {
  if (loss == "grpo") return {/*sde_rollout=*/true, /*microgroup_batches=*/true};
  if (loss == "nft" || loss == "sft") return {/*sde_rollout=*/false, /*microgroup_batches=*/false};
  fail("train.loss = \"{}\": unknown (grpo, nft or sft)", loss);
}

std::unique_ptr<Algorithm> make_algorithm(const AlgorithmOptions& options, const Policy& policy) {
  if (options.loss == "grpo") return std::make_unique<Grpo>(options, policy);
  if (options.loss == "nft") return std::make_unique<Nft>(options, policy);
  if (options.loss == "sft") return std::make_unique<Sft>(options, policy);
  fail("train.loss = \"{}\": unknown (grpo, nft or sft)", options.loss);
}

}  // namespace ditrl::rl
