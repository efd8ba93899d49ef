// Gradient norm (fixed-order fp64 partial sums), clipping and AdamW on the slices.

#include <ditrl/shard/optimizer.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace ditrl::shard {

namespace {

// fp64 sum of squares of an fp32 tensor in a fixed order (blocks summed in
// sequence, block sums added in block order), without temporaries.
double sum_of_squares(const at::Tensor& t) {
  if (!t.device().is_cpu()) return t.to(at::kDouble).square().sum().item<double>();
  constexpr int64_t kBlock = 1 << 16;
  const float* x = t.data_ptr<float>();
  const int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      double sum = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) sum += static_cast<double>(x[i]) * x[i];
      partial[b] = sum;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double grad_norm(const Slices& slices, dist::Communicator& comm) {
  double local = 0;
  for (const auto& unit : slices.units)
    for (const GroupSlices& gs : unit)
      if (gs.grad.defined()) local += sum_of_squares(gs.grad);
  at::Tensor total = at::full({1}, local, slices.on(at::kDouble));
  comm.all_reduce(total, dist::ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

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
