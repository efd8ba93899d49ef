#pragma once

// Qwen-Image's multi-axis rotary embedding (docs/families.md §4.6, diffusers
// QwenEmbedRope with scale_rope=True): complex64 tables over positions
// -4096..4095 for the frame, height and width axes; image rows and columns
// are centred (-ceil(n/2) .. floor(n/2)-1), text token j sits at
// max(h/2, w/2) + j on all three axes.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ditrl::models {

class QwenRope {
 public:
  explicit QwenRope(std::vector<int64_t> axes_dim, int64_t theta = 10000);

  // Complex64 frequencies for the image tokens (F*H*W, head_dim/2), in (f,
  // row, col) order, and the text tokens (text_len, head_dim/2). Tables are
  // built once per device, on that device: the CPU and CUDA tables differ in
  // the last ulp, which drifts through the blocks (docs/families.md §7.1), so a
  // model matches the reference that built its tables where it runs.
  std::pair<at::Tensor, at::Tensor> freqs(int64_t frames, int64_t height, int64_t width, int64_t text_len,
                                          const at::Device& device) const;

  // x (B, L, H, head_dim) times freqs (L, head_dim/2) as complex pairs
  // (x[2m] + i x[2m+1]) in fp32, back to x's dtype.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& freqs);

  static constexpr int64_t kPositions = 4096;

 private:
  std::vector<int64_t> axes_dim_;
  int64_t theta_;
  mutable std::map<std::string, std::pair<at::Tensor, at::Tensor>> cache_;  // (pos, neg) by device
};

}  // namespace ditrl::models
