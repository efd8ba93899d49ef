#pragma once

// SFT rectified-flow velocity loss (docs/algorithms.md §5): the pair is corrupted
// at a snapshot sigma, x_sigma = (1 - sigma) x0 + sigma eps (rl::corrupt), and
//   L_pair = mean_e((v.float() - (eps - x0))^2).

#include <ATen/core/Tensor.h>

namespace ditrl::rl {

struct SftTerms {
  at::Tensor loss_sum;  // scalar, differentiable
  at::Tensor per_pair;  // (B,)
};

// velocity, x0, noise: (B, ...), same shapes; computed in fp32.
SftTerms sft_loss(const at::Tensor& velocity, const at::Tensor& x0, const at::Tensor& noise);

}  // namespace ditrl::rl
