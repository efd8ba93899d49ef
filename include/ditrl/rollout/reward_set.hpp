#pragma once

// The run's rewards: one ([reward]) or several weighted ones ([[reward]]
// entries), scored together. Each reward's raw values are kept, one column
// per reward, so each has its own metric series and the advantages can be
// formed either from the weighted sum of the raw values or as the weighted
// sum of each reward's own group advantage (docs/rewards.md).
//
// A reward that waits on a server is started per micro-group while the
// rollout goes on sampling (start()); finish() joins those requests in the
// order they were started and scores the other rewards on all samples at
// once, as a single reward always has, so a run's bits do not depend on
// which rewards overlap with sampling.

#include <ditrl/rl/advantages.hpp>
#include <ditrl/rollout/reward.hpp>

#include <future>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rollout {

struct WeightedReward {
  std::string name;
  double weight = 1.0;
  std::unique_ptr<Reward> reward;
};

class RewardSet {
 public:
  // `several`: the deck has [[reward]] entries (their names become metric
  // series and trajectory columns), even if only one.
  RewardSet(std::vector<WeightedReward> rewards, bool several, RewardCombine combine);
  // make_reward of each.
  RewardSet(const std::vector<RewardOptions>& options, bool several, RewardCombine combine);

  bool several() const { return several_; }
  int64_t size() const { return static_cast<int64_t>(rewards_.size()); }
  std::vector<std::string> names() const;
  RewardCombine combine() const { return combine_; }
  bool overlaps_sampling() const;

  void begin_rollout(int64_t rollout_id);
  // Starts the asynchronous rewards on the next samples (a micro-group) of
  // the rollout: the samples after those of the previous start().
  void start(const at::Tensor& final_latents, const at::Tensor& prompt_index, const std::vector<std::string>& texts);
  // [N, K] fp32 on the host: reward k's values of the N samples in column k.
  // Asynchronous rewards started on all N samples are joined; the rest score now.
  at::Tensor finish(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                    const std::vector<std::string>& texts);

  // [N] the run's reward, sum_k weight_k * values[:, k] (one reward: its values).
  at::Tensor weighted_sum(const at::Tensor& values) const;
  // [N] advantages of the whole rollout's values [N, K] (groups of
  // options.group_size contiguous samples).
  at::Tensor advantages(const at::Tensor& values, const rl::AdvantageOptions& options) const;

 private:
  at::Tensor weighted(const std::vector<at::Tensor>& columns) const;

  std::vector<WeightedReward> rewards_;
  bool several_;
  RewardCombine combine_;
  std::vector<std::vector<std::future<at::Tensor>>> pending_;  // per reward, in start() order
  int64_t started_ = 0;                                        // samples started since begin_rollout
};

}  // namespace ditrl::rollout
