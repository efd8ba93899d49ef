#include <ditrl/error.hpp>
#include <ditrl/rollout/reward_set.hpp>

#include <ATen/ATen.h>

namespace ditrl::rollout {

namespace {

std::vector<WeightedReward> made(const std::vector<RewardOptions>& options) {
  std::vector<WeightedReward> rewards;
  for (const RewardOptions& o : options) rewards.push_back({o.name, o.weight, make_reward(o)});
  return rewards;
}

}  // namespace

RewardSet::RewardSet(std::vector<WeightedReward> rewards, bool several, RewardCombine combine)
    : rewards_(std::move(rewards)), several_(several), combine_(combine), pending_(rewards_.size()) {
  if (rewards_.empty()) fail("rewards: the run needs at least one reward");
  if (!several_ && rewards_.size() != 1) fail("rewards: {} rewards need [[reward]] entries", rewards_.size());
}

RewardSet::RewardSet(const std::vector<RewardOptions>& options, bool several, RewardCombine combine)
    : RewardSet(made(options), several, combine) {}

std::vector<std::string> RewardSet::names() const {
  std::vector<std::string> out;
  for (const WeightedReward& r : rewards_) out.push_back(r.name);
  return out;
}

bool RewardSet::overlaps_sampling() const {
  for (const WeightedReward& r : rewards_)
    if (r.reward->asynchronous()) return true;
  return false;
}

void RewardSet::begin_rollout(int64_t rollout_id) {
  for (auto& futures : pending_) futures.clear();
  started_ = 0;
  for (WeightedReward& r : rewards_) r.reward->begin_rollout(rollout_id);
}

void RewardSet::start(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                      const std::vector<std::string>& texts) {
  for (size_t k = 0; k < rewards_.size(); ++k)
    if (rewards_[k].reward->asynchronous())
      pending_[k].push_back(rewards_[k].reward->start(final_latents, prompt_index, texts));
  started_ += final_latents.size(0);
}

at::Tensor RewardSet::finish(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                             const std::vector<std::string>& texts) {
  const int64_t n = final_latents.size(0);
  if (started_ != 0 && started_ != n)
    fail("rewards: {} samples were started while sampling but {} are being scored", started_, n);
  std::vector<at::Tensor> columns;
  for (size_t k = 0; k < rewards_.size(); ++k) {
    std::vector<at::Tensor> parts;
    for (std::future<at::Tensor>& f : pending_[k]) parts.push_back(f.get());
    pending_[k].clear();
    const at::Tensor values =
        parts.empty() ? rewards_[k].reward->score(final_latents, prompt_index, texts) : at::cat(parts);
    columns.push_back(checked_rewards(values, n, rewards_[k].reward->name()));
  }
  started_ = 0;
  return at::stack(columns, 1).contiguous();
}

// sum_k weight_k * columns[:, k], accumulated in double, as fp32.
at::Tensor RewardSet::weighted(const std::vector<at::Tensor>& columns) const {
  at::Tensor sum = at::zeros({columns.front().size(0)}, columns.front().options().dtype(at::kDouble));
  for (size_t k = 0; k < rewards_.size(); ++k) sum.add_(columns[k].to(at::kDouble), rewards_[k].weight);
  return sum.to(at::kFloat);
}

at::Tensor RewardSet::weighted_sum(const at::Tensor& values) const {
  if (!several_) return values.select(1, 0).contiguous();
  return weighted(values.unbind(1));
}

at::Tensor RewardSet::advantages(const at::Tensor& values, const rl::AdvantageOptions& options) const {
  if (values.dim() != 2 || values.size(1) != size())
    fail("rewards: expected [samples, {}] reward values, got {} dimensions", size(), values.dim());
  if (!several_ || combine_ == RewardCombine::WeightedSum) return rl::group_advantages(weighted_sum(values), options);
  std::vector<at::Tensor> own;  // each reward's own group advantages
  for (const at::Tensor& column : values.unbind(1)) own.push_back(rl::group_advantages(column.contiguous(), options));
  return weighted(own);
}

}  // namespace ditrl::rollout
