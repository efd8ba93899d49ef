#include <ditrl/error.hpp>
#include <ditrl/models/wan/wan_rope.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace ditrl::models {

namespace {

// diffusers get_1d_rotary_pos_embed(dim, max_seq_len, theta, use_real=True,
// repeat_interleave_real=True, freqs_dtype=float64), op for op.
std::pair<at::Tensor, at::Tensor> axis_table(int64_t dim, int64_t max_seq_len, double theta, const at::Device& device) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  const at::Tensor exponent = at::arange(0, dim, 2, f64).slice(0, 0, dim / 2) / static_cast<double>(dim);
  const at::Tensor inv = at::pow(theta, exponent).reciprocal();
  const at::Tensor pos = at::arange(max_seq_len, at::TensorOptions().dtype(at::kLong).device(device));
  const at::Tensor freqs = at::outer(pos, inv);
  return {freqs.cos().repeat_interleave(2, 1).to(at::kFloat), freqs.sin().repeat_interleave(2, 1).to(at::kFloat)};
}

}  // namespace

WanRope::WanRope(int64_t head_dim, int64_t max_seq_len, double theta)
    : head_dim_(head_dim), max_seq_len_(max_seq_len), theta_(theta) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    fail("wan rope: attention_head_dim must be even and positive, got {}", head_dim);
  if (max_seq_len <= 0) fail("wan rope: rope_max_seq_len must be positive, got {}", max_seq_len);
}

std::pair<at::Tensor, at::Tensor> WanRope::tables(int64_t frames, int64_t height, int64_t width,
                                                  const at::Device& device) const {
  for (const auto& [axis, n] :
       {std::pair<const char*, int64_t>{"frames", frames}, {"height", height}, {"width", width}})
    if (n > max_seq_len_)
      fail("wan rope: the latent grid has {} {} (patches); the model's rope_max_seq_len is {}", n, axis, max_seq_len_);
  auto it = cache_.find(device.str());
  if (it == cache_.end()) {
    // The table is built with the constructor's split (2*(Dh/6) columns for
    // height and width, the rest for time) ...
    const int64_t hw_dim = 2 * (head_dim_ / 6);
    std::vector<at::Tensor> cos, sin;
    for (const int64_t dim : {head_dim_ - 2 * hw_dim, hw_dim, hw_dim}) {
      auto [c, s] = axis_table(dim, max_seq_len_, theta_, device);
      cos.push_back(c);
      sin.push_back(s);
    }
    it = cache_.emplace(device.str(), std::make_pair(at::cat(cos, 1), at::cat(sin, 1))).first;
  }
  // ... and read back with the forward's split (Dh/3 columns for height and
  // width). The two agree when Dh % 6 < 3 (every released config); diffusers
  // mixes the axes otherwise, and so does this.
  const std::vector<int64_t> split = {head_dim_ - 2 * (head_dim_ / 3), head_dim_ / 3, head_dim_ / 3};
  const auto grid = [&](const at::Tensor& table) {
    const std::vector<at::Tensor> axes = table.split_with_sizes(split, 1);
    const std::vector<int64_t> full = {frames, height, width, -1};
    return at::cat({axes[0].slice(0, 0, frames).view({frames, 1, 1, -1}).expand(full),
                    axes[1].slice(0, 0, height).view({1, height, 1, -1}).expand(full),
                    axes[2].slice(0, 0, width).view({1, 1, width, -1}).expand(full)},
                   -1)
        .reshape({1, frames * height * width, 1, -1});
  };
  return {grid(it->second.first), grid(it->second.second)};
}

namespace {

// diffusers WanAttnProcessor's apply_rotary_emb reads x1 = x[..., 0::2],
// x2 = x[..., 1::2], cos of the even and sin of the odd columns, and writes
// (x1 c - x2 s, x1 s + x2 c) in fp32, rounded once to x's dtype. The same
// bits on whole rows, which run as contiguous vector loops instead of
// stride-2 mixed-dtype ones: x c + swap(x) (-s, s) per pair (a - b is
// a + (-b), and sums commute).
struct PairTables {
  at::Tensor cos;   // (c, c) per pair
  at::Tensor sign;  // (-s, s) per pair
};

PairTables pair_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t n) {
  const at::Tensor c = cos.slice(-1, 0, n, 2);
  const at::Tensor s = sin.slice(-1, 1, n, 2);
  return {at::stack({c, c}, -1).flatten(-2), at::stack({-s, s}, -1).flatten(-2)};
}

at::Tensor swap_pairs(const at::Tensor& x) {
  return x.unflatten(-1, {-1, 2}).flip(-1).flatten(-2);
}

at::Tensor rotate(const at::Tensor& x, const PairTables& t) {
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * t.cos + swap_pairs(xf) * t.sign).to(x.scalar_type());
}

// The rotation is linear in x, so its gradient is the rotation by the
// opposite angle. Written out it saves only the tables, not x, and costs a
// fraction of the ops autograd records for the pairwise formula; the roundings
// are autograd's, bit for bit: each product rounded to x's dtype, the two
// summed in it, and + 0 for the zero-filled halves autograd's select
// gradients add.
struct WanRotation : torch::autograd::Function<WanRotation> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    const PairTables t = pair_tables(cos, sin, x.size(-1));
    ctx->saved_data["cos"] = t.cos;
    ctx->saved_data["sign"] = t.sign;
    return rotate(x, t);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& g = grads[0];
    const c10::ScalarType dtype = g.scalar_type();
    // Contiguous like autograd's select gradients: the layout the gradient
    // arrives in (the attention's, or Ulysses' exchange's) must not decide
    // the kernels downstream of it.
    const at::Tensor gf =
        g.is_contiguous() ? g.to(at::kFloat) : at::empty(g.sizes(), g.options().dtype(at::kFloat)).copy_(g);
    // (g1 c, g2 c) + (g2 s, -g1 s), each product rounded to x's dtype.
    const at::Tensor along = (gf * ctx->saved_data["cos"].toTensor()).to(dtype);
    const at::Tensor across = (swap_pairs(gf) * ctx->saved_data["sign"].toTensor().neg()).to(dtype);
    return {(along + across).add_(0), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor WanRope::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return rotate(x, pair_tables(cos, sin, x.size(-1)));
  return WanRotation::apply(x, cos, sin);
}

}  // namespace ditrl::models
