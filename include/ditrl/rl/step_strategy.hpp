#pragma once

// Which denoising steps of a rollout are SDE steps (and so trained) and which
// latents the rollout keeps (docs/algorithms.md §3.2). Seeded and reproducible:
// - sde_window: a contiguous window of w steps whose start is
//   numpy.default_rng(seed).integers(lo, hi - w + 1), reproduced bit for bit
//   (NumpyGenerator), so a seed picks the reference's window.
// - epoch_global_random_choice: w of the candidate steps, shared by every
//   sample of an epoch: sorted(candidates[randperm(|C|, gen)[:w]]) with
//   gen = torch CPU generator seeded with epoch + rollout_seed and
//   epoch = group_index / rollout_batch_size (all candidates when w >= |C|).
//   LibTorch's CPU generator and randperm are Python torch's, so the sets
//   match torch.Generator().manual_seed(...) + torch.randperm.
// - ode_and_return_last (NFT): no SDE step, only the final latent is kept.
// Returned latents for the SDE strategies: S u (S + 1), the x_i and x_{i+1} of every trained pair.
// The deck's rollout.strategy names them; the deck reader (config/) parses
// the name into StepStrategy with kStepStrategyNames.

#include <ditrl/name_table.hpp>

#include <cstdint>
#include <vector>

namespace ditrl::rl {

enum class StepStrategy { SdeWindow, EpochGlobalRandomChoice, OdeAndReturnLast };

inline constexpr NameTable<StepStrategy, 3> kStepStrategyNames{
    {{"sde_window", StepStrategy::SdeWindow},
     {"epoch_global_random_choice", StepStrategy::EpochGlobalRandomChoice},
     {"ode_and_return_last", StepStrategy::OdeAndReturnLast}}};

struct StepSelection {
  std::vector<int64_t> sde_steps;       // sorted loop step indices run as SDE; the rest run as ODE
  std::vector<int64_t> return_latents;  // sorted latent indices in [0, num_steps] the rollout keeps
};

struct StepStrategyOptions {
  StepStrategy strategy = StepStrategy::SdeWindow;
  int64_t num_steps = 10;
  int64_t sde_steps = 1;                 // w: window size / number of steps drawn
  std::vector<int64_t> window;           // sde_window range [lo, hi); empty = [0, num_steps)
  std::vector<int64_t> candidate_steps;  // epoch_global_random_choice
  int64_t rollout_seed = 0;
  int64_t rollout_batch_size = 1;  // prompt groups per rollout (epoch = group_index / this)
};

// The per-sample inputs: `seed` keys sde_window (the sample's generation
// seed), `group_index` the sample's prompt group across the whole run.
struct SampleKey {
  uint64_t seed = 0;
  int64_t group_index = 0;
};

StepSelection select_steps(const StepStrategyOptions& options, const SampleKey& sample);

StepSelection sde_window(int64_t num_steps, int64_t window_size, int64_t lo, int64_t hi, uint64_t seed);
StepSelection epoch_global_random_choice(int64_t num_steps, const std::vector<int64_t>& candidates,
                                         int64_t num_sde_steps, int64_t epoch, int64_t rollout_seed);
StepSelection ode_and_return_last(int64_t num_steps);

}  // namespace ditrl::rl
