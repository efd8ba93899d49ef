#pragma once

// Trajectory files: what `ditrl rollout --out` writes and what `ditrl train
// --trajectories` reads, from ditrl or from an external rollout engine.
// Layout (N samples, T steps, K kept latents, S SDE steps):
//   /timesteps      [T]   fp32  the t snapshot exactly as the DiT consumed it
//   /sigmas         [T+1] fp32  the sigma snapshot, last entry 0
//   /sde_steps      [S]   int64 the steps sampled with the SDE kernel (the rest ODE);
//                         S = 0 for a pure-ODE rollout (NFT, SFT, sde = "ode")
//   /latent_steps   [K]   int64 which x_i /latents holds; absent = all T+1. ditrl
//                         always writes x_0 (the initial noise) first
//   /latents        [N, K, ...] fp32
//   /log_probs      [N, S] fp32  rollout log-prob of x_i -> x_{i+1}, i in /sde_steps
//   /final_latents  [N, ...] fp32 (absent: the last kept latent, which must be x_T)
//   /model_outputs  [N, S, ...] optional: the (guided) velocity at each SDE step
//   /rewards        [N]   fp32 optional (absent: the deck's reward scores x_T); with
//                         [[reward]] entries, their weighted sum
//   /reward_values  [N, K] fp32 optional: each [[reward]] entry's raw value, in the
//                         order of the attribute reward_names ("a,b,c")
//   /advantages     [N]   fp32 optional: the advantages the writing run computed
//                         (for inspection; a reading run computes its own)
//   /prompt_index   [N]   int64
//   /sample_index   [N]   int64 optional (absent: 0..N-1)
//   /cond/<name>    [N, ...] the conditioning the family reads (its cond_spec)
//   /negative/<name> [N, ...] optional negative-prompt conditioning (CFG)
//   attributes: family, sde, noise_level, guidance_scale, rollout_id, deck
// Empty datasets (S = 0) are written with their zero extent. The file is
// written as PATH.tmp and renamed when complete.

#include <ditrl/models/family.hpp>
#include <ditrl/rollout/sampler.hpp>

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::rollout {

struct TrajectoryRecord {
  Trajectories trajectories;
  models::Cond cond;
  models::Cond negative;                  // empty without CFG
  std::vector<std::string> reward_names;  // names /reward_values' columns
  at::Tensor advantages;                  // [N] optional
  std::map<std::string, std::string> text_attrs;
  std::map<std::string, double> number_attrs;
};

// Collective over comm: rank r writes its samples at rows [first_row, first_row + n).
void write_trajectories(const std::string& path, const TrajectoryRecord& local, int64_t first_row, int64_t total_rows,
                        MPI_Comm comm);

// What a reader expects the file to fit.
struct TrajectoryExpectation {
  std::vector<int64_t> latent_shape;  // one sample
  std::vector<models::CondSpec> cond;
  int64_t total_rows = 0;                 // samples of the rollout
  std::vector<std::string> reward_names;  // [[reward]] entries: /reward_values must name these, if present
};

// Reads rows [first_row, first_row + count) and checks every shape, dtype
// and snapshot rule; errors name the file and the dataset.
TrajectoryRecord read_trajectories(const std::string& path, int64_t first_row, int64_t count,
                                   const TrajectoryExpectation& expect);

// Read trajectories (on the host) placed as the sampler leaves its own: the
// latents, log-probs and velocities on `device`, where training combines them
// with its forward's outputs; the indices and rewards stay on the host.
Trajectories to_device(Trajectories t, c10::Device device);

}  // namespace ditrl::rollout
