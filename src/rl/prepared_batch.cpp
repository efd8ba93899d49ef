#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/prepared_batch.hpp>
#include <ditrl/rl/sigma_lookup.hpp>

#include <ATen/ATen.h>

namespace ditrl::rl {

diffusion::StepSigmas PreparedBatch::step_sigmas() const {
  if (!snapshot) fail("prepared batch has no snapshot");
  return diffusion::StepSigmas{sigmas, sigmas_next, snapshot->sigma(1)};
}

namespace {

at::Tensor stack_latents(const std::vector<TrainPair>& pairs, bool next, c10::Device device) {
  std::vector<at::Tensor> rows;
  rows.reserve(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const at::Tensor& t = next ? pairs[i].next_latent : pairs[i].latent;
    if (!t.defined())
      fail("train pair {} (sample {}) has no {}", i, pairs[i].sample_index, next ? "next_latent" : "latent");
    if (t.sizes() != (next ? pairs[0].next_latent : pairs[0].latent).sizes())
      fail("train pair {} (sample {}) has {} of shape {}, pair 0 has {}", i, pairs[i].sample_index,
           next ? "next_latent" : "latent", fmt::join(t.sizes(), "x"),
           fmt::join((next ? pairs[0].next_latent : pairs[0].latent).sizes(), "x"));
    rows.push_back(t.to(device, at::kFloat));
  }
  return at::stack(rows);
}

}  // namespace

PreparedBatch prepare_batch(const std::vector<TrainPair>& pairs, c10::Device device) {
  if (pairs.empty()) fail("prepare_batch: no train pairs");
  const auto n = static_cast<int64_t>(pairs.size());
  for (int64_t i = 0; i < n; ++i) {
    const TrainPair& p = pairs[static_cast<size_t>(i)];
    if (!p.snapshot) fail("train pair {} (sample {}) carries no schedule snapshot", i, p.sample_index);
    if (p.snapshot != pairs[0].snapshot)
      require_same_snapshot(*pairs[0].snapshot, pairs[0].sample_index, *p.snapshot, p.sample_index);
    if (p.next_latent.defined() != pairs[0].next_latent.defined())
      fail("train pair {} (sample {}) {} a next_latent but pair 0 {}", i, p.sample_index,
           p.next_latent.defined() ? "has" : "lacks", pairs[0].next_latent.defined() ? "has one" : "has none");
  }

  at::Tensor timesteps = at::empty({n}, at::kFloat);
  at::Tensor log_prob_old = at::empty({n}, at::kFloat);
  at::Tensor advantages = at::empty({n}, at::kFloat);
  at::Tensor samples = at::empty({n}, at::kLong);
  at::Tensor prompts = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const TrainPair& p = pairs[static_cast<size_t>(i)];
    timesteps.data_ptr<float>()[i] = p.timestep;
    log_prob_old.data_ptr<float>()[i] = p.log_prob_old;
    advantages.data_ptr<float>()[i] = p.advantage;
    samples.data_ptr<int64_t>()[i] = p.sample_index;
    prompts.data_ptr<int64_t>()[i] = p.prompt_index;
  }
  const SnapshotEntries entries = lookup_sigmas(*pairs[0].snapshot, timesteps);

  PreparedBatch b;
  b.latents = stack_latents(pairs, false, device);
  if (pairs[0].next_latent.defined()) b.next_latents = stack_latents(pairs, true, device);
  b.timesteps = dist::host_to_device(entries.timesteps, device);
  b.sigmas = dist::host_to_device(entries.sigmas, device);
  b.sigmas_next = dist::host_to_device(entries.sigmas_next, device);
  b.step_indices = entries.indices;
  b.log_prob_old = dist::host_to_device(log_prob_old, device);
  b.advantages = dist::host_to_device(advantages, device);
  b.sample_indices = samples;
  b.prompt_indices = prompts;
  b.host_timesteps = entries.timesteps;
  b.host_sigmas = entries.sigmas;
  b.step_timestep = entries.timesteps[0].item<float>();
  b.snapshot = pairs[0].snapshot;
  return b;
}

}  // namespace ditrl::rl
