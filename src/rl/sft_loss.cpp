#include <ditrl/error.hpp>
#include <ditrl/rl/sft_loss.hpp>

#include <ATen/ATen.h>

#include <vector>

namespace ditrl::rl {

SftTerms sft_loss(const at::Tensor& velocity, const at::Tensor& x0, const at::Tensor& noise) {
  if (velocity.dim() < 2 || x0.sizes() != velocity.sizes() || noise.sizes() != velocity.sizes())
    fail("sft loss: velocity {}, x0 {} and noise {} must be equal (B, ...) shapes", fmt::join(velocity.sizes(), "x"),
         fmt::join(x0.sizes(), "x"), fmt::join(noise.sizes(), "x"));
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < velocity.dim(); ++d) dims.push_back(d);
  const at::Tensor target = noise.to(at::kFloat) - x0.to(at::kFloat);
  SftTerms r;
  r.per_pair = (velocity.to(at::kFloat) - target).pow(2).mean(dims);
  r.loss_sum = r.per_pair.sum();
  return r;
}

}  // namespace ditrl::rl
