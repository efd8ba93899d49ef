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

namespace {

// AdamW works through a slice one chunk at a time: each of its passes over a
// whole slice (tens of MiB) streamed from memory, while a chunk stays in cache
// from the first pass to the last. A multiple of every SIMD width, so each
// element takes the same vectorised path as in one pass over the slice: the
// same bits.
constexpr int64_t kChunk = 1 << 17;

}  // namespace

void AdamW::step(Slices& slices, double lr) {
  ++steps_;
  if (options_.fused) return fused_step(slices, lr);
  const AdamWOptions& o = options_;
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(steps_));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(steps_));
  if (!denom_.defined()) denom_ = at::empty({kChunk}, slices.on(at::kFloat));
  for (auto& unit : slices.units) {
    for (GroupSlices& gs : unit) {
      if (!gs.master.defined()) continue;
      const bool recast = !gs.compute.is_same(gs.master);
      const int64_t n = gs.master.numel();
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const int64_t len = std::min(kChunk, n - begin);
        at::Tensor master = gs.master.narrow(0, begin, len), exp_avg = gs.exp_avg.narrow(0, begin, len),
                   exp_avg_sq = gs.exp_avg_sq.narrow(0, begin, len);
        const at::Tensor grad = gs.grad.narrow(0, begin, len);
        if (o.weight_decay != 0) master.mul_(1 - lr * o.weight_decay);
        exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
        exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
        // denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)) + eps
        at::Tensor denom = denom_.narrow(0, 0, len);
        at::sqrt_out(denom, exp_avg_sq).div_(std::sqrt(bias_correction2)).add_(o.eps);
        master.addcdiv_(exp_avg, denom, -lr / bias_correction1);
        if (recast) gs.compute.narrow(0, begin, len).copy_(master);
      }
    }
  }
}

void AdamW::fused_step(Slices& slices, double lr) {
  std::vector<at::Tensor> masters, grads, exp_avgs, exp_avg_sqs;
  for (auto& unit : slices.units)
    for (GroupSlices& gs : unit)
      if (gs.master.defined()) {
        masters.push_back(gs.master);
        grads.push_back(gs.grad);
        exp_avgs.push_back(gs.exp_avg);
        exp_avg_sqs.push_back(gs.exp_avg_sq);
      }
  if (masters.empty()) return;
  const AdamWOptions& o = options_;
  const at::Tensor step = at::full({}, static_cast<double>(steps_), slices.on(at::kFloat));
  at::_fused_adamw_(masters, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{},
                    std::vector<at::Tensor>(masters.size(), step), lr, o.beta1, o.beta2, o.weight_decay, o.eps,
                    /*amsgrad=*/false, /*maximize=*/false);
  for (auto& unit : slices.units)
    for (GroupSlices& gs : unit)
      if (gs.master.defined() && !gs.compute.is_same(gs.master)) gs.compute.copy_(gs.master);
}

}  // namespace ditrl::shard
