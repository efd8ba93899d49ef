#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/pairs.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>

#include <algorithm>

namespace ditrl::rl {

namespace {

int64_t slot(const std::vector<int64_t>& values, int64_t value, const char* what) {
  auto it = std::find(values.begin(), values.end(), value);
  if (it == values.end()) fail("rollout kept no {} for step {}", what, value);
  return it - values.begin();
}

int64_t samples_of(const RolloutView& r) {
  return r.sample_index.size(0);
}

// The rollout's per-sample scalars, read to the host once per rollout: on a
// GPU each element's .item() would wait for the device.
struct HostScalars {
  at::Tensor advantages, sample_index, log_probs;

  explicit HostScalars(const RolloutView& r)
      : advantages(r.advantages.cpu()),
        sample_index(r.sample_index.cpu()),
        log_probs(r.log_probs.defined() ? r.log_probs.cpu() : at::Tensor()) {}

  int64_t sample(int64_t row) const { return sample_index[row].item<int64_t>(); }
};

TrainPair base_pair(const RolloutView& r, const HostScalars& host, int64_t row) {
  TrainPair p;
  p.advantage = host.advantages[row].item<float>();
  p.sample_index = host.sample(row);
  p.prompt_index = row;
  p.snapshot = r.snapshot;
  return p;
}

}  // namespace

std::vector<TrainPair> grpo_pairs(const RolloutView& r, int64_t microgroup) {
  const int64_t n = samples_of(r);
  if (microgroup <= 0 || n % microgroup != 0)
    fail("grpo pairs: {} samples do not split into micro-groups of {}", n, microgroup);
  if (r.sde_steps.empty()) fail("grpo pairs: the rollout has no SDE step to train (all steps were ODE)");
  const HostScalars host(r);
  std::vector<TrainPair> pairs;
  for (int64_t group = 0; group < n; group += microgroup)
    for (size_t s = 0; s < r.sde_steps.size(); ++s) {
      const int64_t step = r.sde_steps[s];
      const int64_t k = slot(r.latent_steps, step, "latent"), k_next = slot(r.latent_steps, step + 1, "latent");
      for (int64_t row = group; row < group + microgroup; ++row) {
        TrainPair p = base_pair(r, host, row);
        p.latent = r.latents[row][k];
        p.next_latent = r.latents[row][k_next];
        p.timestep = r.snapshot->timestep(step);
        p.log_prob_old = host.log_probs[row][static_cast<int64_t>(s)].item<float>();
        pairs.push_back(std::move(p));
      }
    }
  return pairs;
}

std::vector<TrainPair> nft_pairs(const RolloutView& r, double timestep_fraction, bool shuffle, int64_t seed) {
  const int64_t num_sigmas = r.snapshot->steps();  // non-terminal sigmas
  const HostScalars host(r);
  std::vector<TrainPair> pairs;
  for (int64_t row = 0; row < samples_of(r); ++row) {
    const int64_t sample = host.sample(row);
    for (int64_t index : nft_sigma_indices(num_sigmas, timestep_fraction, shuffle, seed, sample)) {
      TrainPair p = base_pair(r, host, row);
      p.latent = r.final_latents[row];
      p.timestep = r.snapshot->timestep(index);
      pairs.push_back(std::move(p));
    }
  }
  return pairs;
}

at::Tensor pair_noise(const char* tag, int64_t seed, int64_t rollout_id, const PreparedBatch& batch,
                      const std::vector<int64_t>& latent_shape) {
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < batch.size(); ++i) {
    at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash(
        tag, seed, rollout_id, batch.sample_indices[i].item<int64_t>(), batch.step_indices[i].item<int64_t>()));
    rows.push_back(at::randn(latent_shape, gen, at::TensorOptions().dtype(at::kFloat)));
  }
  return dist::host_to_device(at::stack(rows), batch.latents.device());
}

std::vector<TrainPair> sft_pairs(const RolloutView& r, int64_t pairs_per_sample, int64_t seed, int64_t rollout_id,
                                 const std::vector<size_t>& expert_of_step, const SftRouting& routing) {
  const int64_t steps = r.snapshot->steps();
  const size_t experts =
      expert_of_step.empty() ? 1 : *std::max_element(expert_of_step.begin(), expert_of_step.end()) + 1;
  // Grid indices per expert; a single DiT draws from the whole grid.
  std::vector<std::vector<int64_t>> pools(experts);
  for (int64_t i = 0; i < steps; ++i) pools[experts == 1 ? 0 : expert_of_step.at(i)].push_back(i);
  const HostScalars host(r);
  std::vector<TrainPair> pairs;
  for (int64_t row = 0; row < samples_of(r); ++row) {
    const int64_t sample = host.sample(row);
    at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("sample", seed, rollout_id, sample));
    for (int64_t j = 0; j < pairs_per_sample; ++j) {
      // The pair's global position (pairs are sample-major) gives its chunk and micro-batch.
      const int64_t global_pair = sample * pairs_per_sample + j;
      const int64_t window = global_pair / routing.chunk_pairs % routing.num_windows;
      const int64_t micro = global_pair % routing.chunk_pairs / routing.micro_batch;
      const std::vector<int64_t>& pool =
          experts == 1 ? pools[0] : pools[rl::stable_hash("expert", seed, rollout_id, window, micro) % experts];
      if (pool.empty()) fail("sft: the {}-step grid has no step for one of the {} experts", steps, experts);
      const int64_t k = at::randint(static_cast<int64_t>(pool.size()), {1}, gen, at::TensorOptions().dtype(at::kLong))
                            .item<int64_t>();
      TrainPair p = base_pair(r, host, row);
      p.latent = r.final_latents[row];
      p.timestep = r.snapshot->timestep(pool[k]);
      pairs.push_back(std::move(p));
    }
  }
  return pairs;
}

}  // namespace ditrl::rl
