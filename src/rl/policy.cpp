// Policy forwards as the rollout ran them, and the shadow-weights scope.

#include <ditrl/models/guided.hpp>
#include <ditrl/rl/policy.hpp>

#include <ATen/ATen.h>

namespace ditrl::rl {

namespace {

std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor longs = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel());
}

}  // namespace

at::Tensor Policy::velocity(const TrainingRollout& rollout, const PreparedBatch& b, const at::Tensor& latents,
                            bool guided, const models::ForwardContext& ctx) const {
  const models::Cond cond = rollout.cond.index_select(b.prompt_indices);
  models::ForwardContext batch_ctx = ctx;
  batch_ctx.host_timesteps = b.host_timesteps;
  if (!guided)
    return models::unguided_velocity(*family, {latents, b.timesteps, b.sigmas, &cond, nullptr, b.step_timestep},
                                     guidance, batch_ctx);
  const models::Cond negative = needs_negative ? rollout.negative.index_select(b.prompt_indices) : models::Cond{};
  return models::guided_velocity(
      *family, {latents, b.timesteps, b.sigmas, &cond, needs_negative ? &negative : nullptr, b.step_timestep}, guidance,
      batch_ctx);
}

std::unique_ptr<models::Tap> Policy::train_tap(int64_t rollout_id, const PreparedBatch& b) const {
  if (!dump) return nullptr;
  return dump->tap(DumpSide::Train, rollout_id, values(b.sample_indices), values(b.step_indices), /*trained=*/true);
}

ShadowScope::ShadowScope(EmaShadow& shadow, shard::ShardedParams& params) : shadow_(shadow), params_(params) {
  shadow_.swap();
  params_.refresh_compute();
}

ShadowScope::~ShadowScope() {
  shadow_.swap();
  params_.refresh_compute();
}

std::vector<at::Tensor> trainable_masters(shard::ShardedParams& params) {
  std::vector<at::Tensor> out;
  for (const shard::ShardPiece& p : params.pieces())
    if (p.trainable) out.push_back(p.master);
  return out;
}

}  // namespace ditrl::rl
