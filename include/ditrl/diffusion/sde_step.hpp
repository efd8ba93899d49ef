#pragma once

// One denoising transition x -> x_next with its Gaussian score (docs/algorithms.md
// §2). The same function serves the rollout (draws or takes the noise and
// returns x_next) and the trainer (scores a recorded x_next), so the two sides
// run identical arithmetic. Everything is computed in fp32 whatever the
// forward dtype.
//
// Flow-SDE (flow_grpo, "sde"):
//   dt = sigma_next - sigma
//   std_dev_t = sqrt(sigma / (1 - (sigma == 1 ? sigmas[1] : sigma))) * eta
//   mean = x * (1 + std_dev_t^2 / (2 sigma) * dt) + v * (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) * dt
//   s = std_dev_t * sqrt(-dt);  log_prob = mean_e[-(x_next - mean)^2 / (2 s^2) - log s - log sqrt(2 pi)]
// Flow-CPS (FlowCPS, "cps"), all constants dropped:
//   s = std_dev_t = sigma_next * sin(eta pi / 2)
//   mean = (x - sigma v)(1 - sigma_next) + (x + (1 - sigma) v) sqrt(sigma_next^2 - s^2)
//   log_prob = mean_e[-(x_next - mean)^2]
//   No clamp inside the sqrt (miles clamps to 1e-12): in fp32 fl(sigma_next * sin)^2 <= fl(sigma_next^2)
//   because |sin| <= 1 and rounding is monotone, so the argument is never negative, and the clamp
//   would add x1_hat * 1e-6 on the terminal step where the rollout engine adds 0.
// ODE ("ode"): mean = x_next = x + dt v, s = 0, no log-prob; scoring an ODE step is an error, and
//   drawing does not advance the generator.

#include <ditrl/diffusion/sde_type.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace ditrl::diffusion {

struct StepKernel {
  SdeType type = SdeType::Sde;
  double noise_level = 0.7;  // eta; must be > 0 for sde and cps (cps: eta <= 1)
};

// The sigmas of one step, from the rollout's snapshot at the step's index.
struct StepSigmas {
  at::Tensor sigma;       // (B,) or (1,) fp32: sigmas[i]
  at::Tensor sigma_next;  // (B,) or (1,) fp32: sigmas[i + 1]
  float sigma_after_one;  // the snapshot's sigmas[1]: stands in for sigma in 1 - sigma where sigma == 1 (Flow-SDE)
};

// Where x_next comes from.
class StepTarget {
 public:
  static StepTarget draw(at::Generator generator);  // rollout: eps ~ N(0, I) from `generator`
  static StepTarget noise(at::Tensor eps);          // rollout: the given eps
  static StepTarget score(at::Tensor x_next);       // training: the recorded x_next

  enum class Kind { Draw, Noise, Score };
  Kind kind() const { return kind_; }
  const at::Generator& generator() const { return generator_; }
  const at::Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_ = Kind::Draw;
  at::Generator generator_;
  at::Tensor tensor_;
};

struct StepResult {
  at::Tensor next;       // x_next, fp32
  at::Tensor mean;       // transition mean, fp32, carries the velocity's autograd graph
  at::Tensor noise_std;  // s, (B or 1, 1, ..., 1): the transition's Gaussian std
  at::Tensor std_dev_t;  // (B or 1, 1, ..., 1): Flow-SDE diffusion scale (no sqrt(-dt)), = s for CPS, 0 for ODE
  at::Tensor log_prob;   // (B,) mean over every non-batch element; undefined for ODE
};

// velocity, sample: (B, ...) in any floating dtype (upcast to fp32).
StepResult sde_step(const StepKernel& kernel, const at::Tensor& velocity, const at::Tensor& sample,
                    const StepSigmas& sigmas, const StepTarget& target);

}  // namespace ditrl::diffusion
