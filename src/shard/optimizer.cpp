// Gradient clipping and AdamW on the slices.

#include <ditrl/shard/grad_norm.hpp>
#include <ditrl/shard/optimizer.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace ditrl::shard {

double clip_grad(Slices& slices, dist::Communicator& comm, double max_norm) {
  const double norm = grad_norm(slices, comm);
  if (!std::isfinite(norm)) return norm;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1)
    for (auto& unit : slices.units)
      for (GroupSlices& gs : unit)
        if (gs.grad.defined()) gs.grad.mul_(coefficient);
  return norm;
}

void AdamW::step(Slices& slices, double lr) {
  ++steps_;
  const AdamWOptions& o = options_;
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(steps_));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(steps_));
  for (auto& unit : slices.units) {
    for (GroupSlices& gs : unit) {
      if (!gs.master.defined()) continue;
      if (o.weight_decay != 0) gs.master.mul_(1 - lr * o.weight_decay);
      gs.exp_avg.mul_(o.beta1).add_(gs.grad, 1 - o.beta1);
      gs.exp_avg_sq.mul_(o.beta2).addcmul_(gs.grad, gs.grad, 1 - o.beta2);
      // denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)) + eps, in reused memory.
      const int64_t bytes = gs.exp_avg_sq.numel() * static_cast<int64_t>(sizeof(float));
      if (!denom_.defined() || denom_.numel() < bytes) denom_ = at::empty({bytes}, slices.on(at::kByte));
      at::Tensor denom = denom_.narrow(0, 0, bytes).view(at::kFloat);
      at::sqrt_out(denom, gs.exp_avg_sq).div_(std::sqrt(bias_correction2)).add_(o.eps);
      gs.master.addcdiv_(gs.exp_avg, denom, -lr / bias_correction1);
      if (!gs.compute.is_same(gs.master)) gs.compute.copy_(gs.master);
    }
  }
}

}  // namespace ditrl::shard
