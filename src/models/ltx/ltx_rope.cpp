#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/ltx/ltx_rope.hpp>

#include <ATen/ATen.h>

#include <cmath>

namespace ditrl::models {

at::Tensor ltx_frequency_grid(double theta, int64_t axes, int64_t inner_dim, bool double_precision) {
  const int64_t n = inner_dim / (2 * axes);
  if (n < 1) fail("ltx rope: width {} is too small for {} position axes (needs >= {})", inner_dim, axes, 2 * axes);
  if (!double_precision) {
    // torch: theta ** linspace(log_theta(1), log_theta(theta), n) in fp32, then * pi / 2.
    const at::Tensor exponents = at::linspace(0.0, 1.0, n, at::TensorOptions().dtype(at::kFloat));
    return at::pow(theta, exponents) * M_PI / 2;
  }
  // numpy: linspace(0, 1, n) is i * (1 / (n - 1)) with the last entry set to
  // exactly 1; pow and the pi/2 factor in float64, one rounding to fp32.
  at::Tensor grid = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  float* out = grid.data_ptr<float>();
  const double step = n > 1 ? 1.0 / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double exponent = i == n - 1 && n > 1 ? 1.0 : static_cast<double>(i) * step;
    out[i] = static_cast<float>(std::pow(theta, exponent) * M_PI / 2);
  }
  return grid;
}

RopeTables ltx_rope_tables(const at::Tensor& positions, const RopeOptions& o, c10::ScalarType dtype) {
  const int64_t axes = static_cast<int64_t>(o.max_pos.size());
  if (positions.dim() != 4 || positions.size(1) != axes || positions.size(3) != 2)
    fail("ltx rope: positions must be (B, {}, T, 2) [start, end) bounds, got shape {}", axes,
         c10::str(positions.sizes()));
  if (o.heads < 1 || o.inner_dim % (2 * o.heads) != 0)
    fail("ltx rope: width {} does not split into {} heads of even size", o.inner_dim, o.heads);
  const at::Tensor grid = positions.to(at::kFloat);
  const at::Tensor coords = o.middle ? (grid.select(-1, 0) + grid.select(-1, 1)) / 2.0 : grid.select(-1, 0);
  std::vector<at::Tensor> fractions;
  for (int64_t a = 0; a < axes; ++a) fractions.push_back(coords.select(1, a) / o.max_pos[static_cast<size_t>(a)]);
  const at::Tensor fractional = at::stack(fractions, -1);  // (B, T, axes)
  const at::Tensor frequencies =
      dist::host_to_device(ltx_frequency_grid(o.theta, axes, o.inner_dim, o.double_precision), positions.device());
  // (B, T, axes, n) -> frequency-major, axis-minor (B, T, n * axes)
  const at::Tensor angles = (frequencies * (fractional.unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(2);
  at::Tensor cos = angles.cos();
  at::Tensor sin = angles.sin();
  const int64_t pad = o.inner_dim / 2 - angles.size(-1);
  if (pad != 0) {
    cos = at::cat({at::ones_like(cos.slice(2, 0, pad)), cos}, -1);
    sin = at::cat({at::zeros_like(sin.slice(2, 0, pad)), sin}, -1);
  }
  const int64_t b = cos.size(0), t = cos.size(1);
  return {cos.reshape({b, t, o.heads, -1}).transpose(1, 2).to(dtype),
          sin.reshape({b, t, o.heads, -1}).transpose(1, 2).to(dtype)};
}

at::Tensor apply_ltx_rope(const at::Tensor& x, const RopeTables& pe) {
  const int64_t heads = pe.cos.size(1);
  const int64_t half = pe.cos.size(-1);
  if (x.dim() != 3 || x.size(-1) != heads * 2 * half)
    fail("ltx rope: cannot rotate shape {} with tables for {} heads of {} angles", c10::str(x.sizes()), heads, half);
  const at::Tensor split =
      x.view({x.size(0), x.size(1), heads, 2 * half}).transpose(1, 2).unflatten(-1, {2, half});  // (B, H, T, 2, Dh/2)
  const at::Tensor first = split.slice(-2, 0, 1);
  const at::Tensor second = split.slice(-2, 1, 2);
  const at::Tensor cos = pe.cos.unsqueeze(-2);
  const at::Tensor sin = pe.sin.unsqueeze(-2);
  at::Tensor out = split * cos;
  out.slice(-2, 0, 1).addcmul_(-sin, second);
  out.slice(-2, 1, 2).addcmul_(sin, first);
  return out.flatten(-2).transpose(1, 2).flatten(-2);
}

at::Tensor ltx_video_positions(int64_t batch, int64_t frames, int64_t height, int64_t width, double fps,
                               const at::Device& device) {
  if (frames < 1 || height < 1 || width < 1 || !(fps > 0))
    fail("ltx positions: need a positive latent grid and frame rate, got {}x{}x{} at {} fps", frames, height, width,
         fps);
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  const std::vector<at::Tensor> mesh =
      at::meshgrid({at::arange(frames, i64), at::arange(height, i64), at::arange(width, i64)}, "ij");
  const at::Tensor start = at::stack(mesh, 0).reshape({3, -1});  // (3, T)
  const at::Tensor bounds = at::stack({start, start + 1}, -1);   // (3, T, 2), patch size 1
  const at::Tensor scale = dist::host_to_device(at::tensor({8.0f, 32.0f, 32.0f}), device).view({3, 1, 1});
  at::Tensor pixels = bounds.to(at::kFloat) * scale;
  const at::Tensor time = ((pixels.select(0, 0) + 1 - 8).clamp_min(0)) / fps;
  pixels = at::cat({time.unsqueeze(0), pixels.slice(0, 1)}, 0);
  return pixels.unsqueeze(0).expand({batch, -1, -1, -1}).contiguous();
}

}  // namespace ditrl::models
