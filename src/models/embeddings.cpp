#include <ditrl/error.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/widened_gemm.hpp>

#include <ATen/ATen.h>

#include <cmath>

namespace ditrl::models {

at::Tensor timestep_sinusoid(const at::Tensor& t, const SinusoidOptions& o) {
  if (t.dim() != 1) fail("timesteps must be a 1-D tensor, got shape {}", c10::str(t.sizes()));
  const int64_t half = o.dim / 2;
  at::Tensor exponent = at::arange(half, t.options().dtype(at::kFloat)) * (-std::log(o.max_period));
  exponent = exponent / (static_cast<double>(half) - o.shift);
  at::Tensor emb = t.unsqueeze(1).to(at::kFloat) * at::exp(exponent).unsqueeze(0);
  emb = emb * o.scale;
  emb = at::cat({at::sin(emb), at::cos(emb)}, -1);
  if (o.flip_sin_to_cos) emb = at::cat({emb.slice(1, half), emb.slice(1, 0, half)}, -1);
  if (o.dim % 2 == 1) emb = at::constant_pad_nd(emb, {0, 1, 0, 0});
  return emb;
}

at::Tensor activate(const at::Tensor& x, Activation act) {
  return act == Activation::SiLU ? at::silu(x) : at::gelu(x, "tanh");
}

MLPEmbedding::MLPEmbedding(int64_t in, int64_t dim, int64_t out, Activation act, const at::TensorOptions& options,
                           bool bias)
    : act_(act) {
  linear_1 = register_module("linear_1", std::make_shared<Linear>(in, dim, bias, options));
  linear_2 = register_module("linear_2", std::make_shared<Linear>(dim, out, bias, options));
}

PatchProjection::PatchProjection(int64_t in_channels, int64_t dim, const std::vector<int64_t>& patch,
                                 const at::TensorOptions& options)
    : patch_(patch) {
  std::vector<int64_t> shape = {dim, in_channels};
  shape.insert(shape.end(), patch.begin(), patch.end());
  weight = register_parameter("weight", at::empty(shape, options));
  bias = register_parameter("bias", at::empty({dim}, options));
}

at::Tensor PatchProjection::forward(const at::Tensor& x) const {
  if (x.dim() != static_cast<int64_t>(patch_.size()) + 2)
    fail("patch projection expects a {}-D latent, got shape {}", patch_.size() + 2, c10::str(x.sizes()));
  return patch_conv(x, weight, bias, patch_);
}

namespace {

// diffusers get_1d_sincos_pos_embed_from_grid: (N,) fp32 positions -> (N, dim) fp64.
at::Tensor sincos_1d(int64_t dim, const at::Tensor& pos) {
  at::Tensor omega = at::arange(dim / 2, at::TensorOptions().dtype(at::kDouble));
  omega = omega / (static_cast<double>(dim) / 2.0);
  omega = at::pow(10000.0, omega).reciprocal();
  const at::Tensor angles = pos.reshape({-1, 1}).to(at::kDouble) * omega.unsqueeze(0);
  return at::cat({at::sin(angles), at::cos(angles)}, 1);
}

}  // namespace

GridWindow GridWindow::centre(int64_t grid, int64_t h, int64_t w) {
  return {(grid - h) / 2, (grid - w) / 2, h, w};
}

bool GridWindow::contains(const GridWindow& inner) const {
  return inner.top >= top && inner.left >= left && inner.top + inner.height <= top + height &&
         inner.left + inner.width <= left + width;
}

at::Tensor sincos_pos_embed_window(int64_t dim, int64_t grid, double base_size, double interpolation_scale,
                                   const GridWindow& window) {
  if (window.top < 0 || window.left < 0 || window.top + window.height > grid || window.left + window.width > grid)
    fail("sin-cos table: window rows [{}, {}) x columns [{}, {}) is outside the {}x{} grid", window.top,
         window.top + window.height, window.left, window.left + window.width, grid, grid);
  const at::Tensor coords = at::arange(grid, at::TensorOptions().dtype(at::kFloat)) /
                            (static_cast<double>(grid) / base_size) / interpolation_scale;
  // Token r*grid + c is [S(coords[c]) | S(coords[r])] (diffusers' "xy"
  // meshgrid: the column half first): one (grid, width) table of S over the
  // whole grid (so every value is computed exactly as for the whole table),
  // cast to fp32 once and broadcast into both halves of the window's rows;
  // the (grid*grid, dim) fp64 table is never built (SD3.5's 384x384x1536 one
  // peaked at 4.5 GB).
  const at::Tensor table = sincos_1d(dim / 2, coords).to(at::kFloat);
  const int64_t width = table.size(1);
  const int64_t h = window.height, w = window.width;
  at::Tensor out = at::empty({h, w, 2 * width}, at::TensorOptions().dtype(at::kFloat));
  out.narrow(2, 0, width).copy_(table.narrow(0, window.left, w).unsqueeze(0).expand({h, w, width}));
  out.narrow(2, width, width).copy_(table.narrow(0, window.top, h).unsqueeze(1).expand({h, w, width}));
  return out.reshape({h * w, 2 * width});
}

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid, double base_size, double interpolation_scale) {
  return sincos_pos_embed_window(dim, grid, base_size, interpolation_scale, {0, 0, grid, grid});
}

PatchEmbed::PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch, int64_t pos_embed_max_size, double base_size,
                       const at::TensorOptions& options, const at::TensorOptions& buffer_options,
                       std::optional<std::pair<int64_t, int64_t>> window)
    : patch_(patch), max_size_(pos_embed_max_size) {
  proj = register_module(
      "proj", std::make_shared<PatchProjection>(in_channels, dim, std::vector<int64_t>{patch, patch}, options));
  const int64_t rows = pos_embed_max_size * pos_embed_max_size;
  const at::TensorOptions f32 = buffer_options.dtype(at::kFloat);
  const bool compute = !buffer_options.device().is_meta();
  if (window) {
    const auto [h, w] = *window;
    if (h > max_size_ || w > max_size_)
      fail("latent grid {}x{} (patches) exceeds pos_embed_max_size {}", h, w, max_size_);
    rect_ = GridWindow::centre(max_size_, h, w);
    // On the meta device (`ditrl plan`) the window has its shape only.
    window_ =
        compute
            ? sincos_pos_embed_window(dim, max_size_, base_size, 1.0, rect_).unsqueeze(0).to(buffer_options.device())
            : at::empty({1, h * w, dim}, f32);
  }
  at::Tensor table = !compute || windowed()
                         ? at::empty({1, rows, dim}, f32.device(c10::kMeta))
                         : sincos_pos_embed_2d(dim, max_size_, base_size, 1.0).unsqueeze(0).to(buffer_options.device());
  pos_embed = register_buffer("pos_embed", table);
}

void PatchEmbed::fill_window(const ReadRange& read) {
  if (!windowed()) fail("pos_embed: fill_window on a patch embedding that holds its whole table");
  const int64_t dim = window_.size(-1);
  const at::Tensor rows = window_.view({rect_.height, rect_.width * dim});
  for (int64_t r = 0; r < rect_.height; ++r) {
    const int64_t begin = ((rect_.top + r) * max_size_ + rect_.left) * dim;
    rows[r].copy_(read(begin, begin + rect_.width * dim));
  }
}

at::Tensor PatchEmbed::cropped_pos_embed(int64_t h, int64_t w) const {
  if (h > max_size_ || w > max_size_)
    fail("latent grid {}x{} (patches) exceeds pos_embed_max_size {}", h, w, max_size_);
  const GridWindow crop = GridWindow::centre(max_size_, h, w);
  if (!windowed()) {
    return pos_embed.reshape({1, max_size_, max_size_, -1})
        .slice(1, crop.top, crop.top + h)
        .slice(2, crop.left, crop.left + w)
        .reshape({1, -1, pos_embed.size(-1)});
  }
  if (!rect_.contains(crop))
    fail(
        "pos_embed: this model holds only the centre crop of a {}x{}-patch latent grid (rows [{}, {}), columns [{}, "
        "{}) of the {}x{} table, the run's rollout.height x rollout.width); a {}x{}-patch grid reads rows [{}, {}), "
        "columns [{}, {}), outside it",
        rect_.height, rect_.width, rect_.top, rect_.top + rect_.height, rect_.left, rect_.left + rect_.width, max_size_,
        max_size_, h, w, crop.top, crop.top + h, crop.left, crop.left + w);
  return window_.reshape({1, rect_.height, rect_.width, -1})
      .slice(1, crop.top - rect_.top, crop.top - rect_.top + h)
      .slice(2, crop.left - rect_.left, crop.left - rect_.left + w)
      .reshape({1, -1, window_.size(-1)});
}

at::Tensor PatchEmbed::forward(const at::Tensor& latent) const {
  const int64_t h = latent.size(-2) / patch_;
  const int64_t w = latent.size(-1) / patch_;
  const at::Tensor x = proj->forward(latent).flatten(2).transpose(1, 2).contiguous();
  return (x + cropped_pos_embed(h, w)).to(x.scalar_type());
}

at::Tensor unpatchify_2d(const at::Tensor& x, int64_t h, int64_t w, int64_t patch, int64_t channels) {
  return x.reshape({x.size(0), h, w, patch, patch, channels})
      .permute({0, 5, 1, 3, 2, 4})
      .reshape({x.size(0), channels, h * patch, w * patch});
}

}  // namespace ditrl::models
