#pragma once

// Wan's 3-D rotary position embedding (docs/families.md §2.6, diffusers
// WanRotaryPosEmbed): per-axis frequency tables for time, height and width
// computed in float64, repeat-interleaved and stored fp32, rotating
// interleaved pairs (x[2j], x[2j+1]) of q and k.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace ditrl::models {

class WanRope {
 public:
  WanRope(int64_t head_dim, int64_t max_seq_len, double theta = 10000.0);

  // cos and sin (1, F*H*W, 1, head_dim) fp32 for a grid of F x H x W
  // patches, tokens in (f, h, w) row-major order. The full tables are built
  // once per device, on that device (the values a reference running there
  // computes), then indexed.
  std::pair<at::Tensor, at::Tensor> tables(int64_t frames, int64_t height, int64_t width,
                                           const at::Device& device) const;

  // Rotates x (B, L, H, head_dim) with the tables: fp32 arithmetic, one
  // rounding to x's dtype.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  int64_t max_seq_len() const { return max_seq_len_; }

 private:
  int64_t head_dim_, max_seq_len_;
  double theta_;
  mutable std::map<std::string, std::pair<at::Tensor, at::Tensor>> cache_;  // by device
};

}  // namespace ditrl::models
