#include <ditrl/error.hpp>
#include <ditrl/models/qwen_image/qwen_rope.hpp>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace ditrl::models {

namespace {

// diffusers QwenEmbedRope.rope_params: fp32 inverse frequencies, the outer
// product with the integer positions, then polar(1, angle).
at::Tensor rope_params(const at::Tensor& index, int64_t dim, int64_t theta) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(index.device());
  const at::Tensor exponent = at::arange(0, dim, 2, index.options()).to(f32).div(static_cast<double>(dim));
  const at::Tensor angle = at::outer(index, at::pow(at::Scalar(theta), exponent).reciprocal());
  return at::polar(at::ones_like(angle), angle);
}

}  // namespace

QwenRope::QwenRope(std::vector<int64_t> axes_dim, int64_t theta) : axes_dim_(std::move(axes_dim)), theta_(theta) {
  if (axes_dim_.size() != 3) fail("qwen rope: axes_dims_rope must have 3 entries, got {}", axes_dim_.size());
  for (int64_t d : axes_dim_)
    if (d <= 0 || d % 2 != 0) fail("qwen rope: every axes_dims_rope entry must be even and positive, got {}", d);
}

std::pair<at::Tensor, at::Tensor> QwenRope::freqs(int64_t frames, int64_t height, int64_t width, int64_t text_len,
                                                  const at::Device& device) const {
  const int64_t text_start = std::max(height / 2, width / 2);
  if (frames > kPositions || height > kPositions || width > kPositions || text_start + text_len > kPositions)
    fail("qwen rope: image grid {}x{}x{} with {} text tokens needs positions beyond {}", frames, height, width,
         text_len, kPositions);
  auto it = cache_.find(device.str());
  if (it == cache_.end()) {
    // Built once and kept, and the text frequencies are a view of them: built
    // inside a rollout's inference mode they would be inference tensors, which
    // the training forward cannot save for backward.
    const c10::InferenceMode normal_tensors(false);
    const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
    const at::Tensor pos_index = at::arange(kPositions, i64);
    const at::Tensor neg_index = at::arange(kPositions, i64).flip(0) * -1 - 1;
    std::vector<at::Tensor> pos, neg;
    for (int64_t d : axes_dim_) {
      pos.push_back(rope_params(pos_index, d, theta_));
      neg.push_back(rope_params(neg_index, d, theta_));
    }
    it = cache_.emplace(device.str(), std::make_pair(at::cat(pos, 1), at::cat(neg, 1))).first;
  }
  const at::Tensor& pos_freqs = it->second.first;
  const at::Tensor& neg_freqs = it->second.second;
  const std::vector<int64_t> split = {axes_dim_[0] / 2, axes_dim_[1] / 2, axes_dim_[2] / 2};
  const std::vector<at::Tensor> pos = pos_freqs.split_with_sizes(split, 1);
  const std::vector<at::Tensor> neg = neg_freqs.split_with_sizes(split, 1);
  // Centred rows/columns: the last ceil(n/2) negative positions, then 0 .. n/2-1.
  const auto centred = [&](size_t axis, int64_t n) {
    return at::cat({neg[axis].slice(0, kPositions - (n - n / 2)), pos[axis].slice(0, 0, n / 2)}, 0);
  };
  const std::vector<int64_t> full = {frames, height, width, -1};
  const at::Tensor image = at::cat({pos[0].slice(0, 0, frames).view({frames, 1, 1, -1}).expand(full),
                                    centred(1, height).view({1, height, 1, -1}).expand(full),
                                    centred(2, width).view({1, 1, width, -1}).expand(full)},
                                   -1)
                               .reshape({frames * height * width, -1});
  return {image, pos_freqs.slice(0, text_start, text_start + text_len)};
}

at::Tensor QwenRope::apply(const at::Tensor& x, const at::Tensor& freqs) {
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() /= 2;
  pairs.push_back(2);
  const at::Tensor rotated = at::view_as_complex(x.to(at::kFloat).reshape(pairs)) * freqs.unsqueeze(1);
  return at::view_as_real(rotated).flatten(3).to(x.scalar_type());
}

}  // namespace ditrl::models
