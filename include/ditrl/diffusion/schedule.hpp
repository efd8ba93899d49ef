#pragma once

// Flow-matching sigma schedules (docs/algorithms.md §1) and the snapshot a rollout
// records. The trajectory's timesteps t and the sigmas the DiT consumed are
// computed separately and can sit 1-2 fp32 ULPs apart (t = fl32(sigma * 1000)
// does not divide back to sigma), so a Schedule keeps both arrays and nothing
// downstream ever rescales one into the other.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::diffusion {

// What a rollout records and every training pair of its samples refers to.
struct Schedule {
  at::Tensor timesteps;  // [T] fp32, CPU: the t fed to the sampling loop, in [0, num_train_timesteps]
  at::Tensor sigmas;     // [T+1] fp32, CPU: the sigmas of the Euler/SDE steps, last entry 0

  int64_t steps() const { return timesteps.defined() ? timesteps.size(0) : 0; }
  float timestep(int64_t i) const;
  float sigma(int64_t i) const;
  // Throws naming `what` unless the arrays are 1-D fp32 CPU tensors of sizes T and T+1, T >= 1.
  void check(const std::string& what) const;
};

// diffusers' FlowMatchEulerDiscreteScheduler time shift applied to a grid.
enum class TimeShiftType { Exponential, Linear };

struct DynamicShift {
  double mu = 0.0;
  TimeShiftType type = TimeShiftType::Exponential;
};

// FlowMatchEulerDiscreteScheduler(__init__ config) + set_timesteps(n, sigmas, mu),
// reproduced bit for bit (docs/algorithms.md §1.1-1.2, NumPy 1.x promotion rules).
struct FlowMatchOptions {
  int64_t steps = 10;                    // n; ignored when `sigmas` is given (n = its size)
  int64_t num_train_timesteps = 1000;    // N
  double shift = 1.0;                    // static shift, applied in __init__ and again on the grid
  std::optional<DynamicShift> dynamic;   // use_dynamic_shifting with this mu (replaces the static shift)
  std::optional<double> shift_terminal;  // stretch so the last non-terminal sigma is ~this value
  // Sigmas the pipeline passes to set_timesteps (e.g. Qwen-Image's linspace(1, 1/n, n)); they are
  // rounded to fp32 and shifted/stretched in fp32. Empty = the scheduler's own float64 grid.
  std::vector<double> sigmas;
};

Schedule flow_match_schedule(const FlowMatchOptions& options);

// Resolution-dependent mu of the Flux/Qwen pipelines (`calculate_shift`):
// linear in the packed image sequence length between (base_seq_len, base_shift)
// and (max_seq_len, max_shift).
struct ResolutionShift {
  int64_t base_seq_len = 256;
  int64_t max_seq_len = 4096;
  double base_shift = 0.5;
  double max_shift = 1.15;
};

double resolution_mu(int64_t seq_len, const ResolutionShift& shift);

// NumPy's linspace(start, stop, num) in float64 (the arithmetic of numpy 1.x:
// i * step + start, last entry = stop).
std::vector<double> numpy_linspace(double start, double stop, int64_t num);

// ltx_core's LTX2Scheduler.execute: fp32 torch linspace(1, 0, steps + 1),
// token-count-dependent exponential shift, stretch to `terminal`. The trajectory
// timesteps are fl32(sigma * num_train_timesteps).
struct Ltx2Options {
  int64_t steps = 10;
  int64_t tokens = 4096;  // latent voxels F*H*W (patch size 1)
  double max_shift = 2.05;
  double base_shift = 0.95;
  bool stretch = true;
  double terminal = 0.1;
  int64_t num_train_timesteps = 1000;
};

Schedule ltx2_schedule(const Ltx2Options& options);

}  // namespace ditrl::diffusion
