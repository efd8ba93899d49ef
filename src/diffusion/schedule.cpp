#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>

#include <cmath>

namespace ditrl::diffusion {

float Schedule::timestep(int64_t i) const {
  check("schedule");
  if (i < 0 || i >= steps()) fail("timestep index {} is outside the schedule's {} steps", i, steps());
  return timesteps.data_ptr<float>()[i];
}

float Schedule::sigma(int64_t i) const {
  check("schedule");
  if (i < 0 || i > steps()) fail("sigma index {} is outside the schedule's {} sigmas", i, steps() + 1);
  return sigmas.data_ptr<float>()[i];
}

void Schedule::check(const std::string& what) const {
  auto require_1d_fp32 = [&](const at::Tensor& t, const char* name) {
    if (!t.defined()) fail("{}: {} is missing", what, name);
    if (t.dim() != 1 || t.scalar_type() != at::kFloat || !t.device().is_cpu() || !t.is_contiguous())
      fail("{}: {} must be a contiguous 1-D fp32 CPU tensor, got {} {} of shape {} on {}", what, name,
           t.is_contiguous() ? "contiguous" : "strided", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"),
           t.device().str());
  };
  require_1d_fp32(timesteps, "timesteps");
  require_1d_fp32(sigmas, "sigmas");
  if (timesteps.size(0) < 1 || sigmas.size(0) != timesteps.size(0) + 1)
    fail("{}: expected timesteps [T] and sigmas [T+1] with T >= 1 (sigmas end with the terminal 0), got [{}] and [{}]",
         what, timesteps.size(0), sigmas.size(0));
}

std::vector<double> numpy_linspace(double start, double stop, int64_t num) {
  if (num < 1) fail("linspace needs at least one point, got {}", num);
  std::vector<double> y(static_cast<size_t>(num));
  const int64_t div = num - 1;
  const double delta = stop - start;
  const double step = div > 0 ? delta / static_cast<double>(div) : 0.0;
  for (int64_t i = 0; i < num; ++i) {
    double v = static_cast<double>(i);
    if (div == 0 || step == 0.0) {  // numpy scales by delta after dividing by div when the step underflows to 0
      if (div > 0) v /= static_cast<double>(div);
      v = v * delta;
    } else {
      v = v * step;
    }
    y[static_cast<size_t>(i)] = v + start;
  }
  if (num > 1) y.back() = stop;
  return y;
}

double resolution_mu(int64_t seq_len, const ResolutionShift& shift) {
  if (shift.max_seq_len == shift.base_seq_len)
    fail("resolution shift needs max_seq_len != base_seq_len (both {})", shift.base_seq_len);
  const double m = (shift.max_shift - shift.base_shift) / static_cast<double>(shift.max_seq_len - shift.base_seq_len);
  const double b = shift.base_shift - m * static_cast<double>(shift.base_seq_len);
  return static_cast<double>(seq_len) * m + b;
}

namespace {

// The templated shift/stretch steps run in the NumPy dtype of the grid: double
// for the scheduler's own grid, float for passed sigmas. Python floats taking
// part (shift, exp(mu)) are rounded to that dtype first, as NumPy does for a
// Python scalar meeting an array.
template <class Real>
Real shifted(Real s, const FlowMatchOptions& o) {
  if (o.dynamic) {
    const Real ratio = Real(1) / s - Real(1);  // (1/t - 1) ** 1.0 is exact
    if (o.dynamic->type == TimeShiftType::Exponential) {
      const Real e = static_cast<Real>(std::exp(o.dynamic->mu));
      return e / (e + ratio);
    }
    const Real mu = static_cast<Real>(o.dynamic->mu);
    return mu / (mu + ratio);
  }
  const Real shift = static_cast<Real>(o.shift);
  const Real shift_m1 = static_cast<Real>(o.shift - 1.0);
  return shift * s / (Real(1) + shift_m1 * s);
}

// stretch_shift_to_terminal: z = 1 - s; k = z[-1] / (1 - shift_terminal); s = 1 - z / k.
// k is a NumPy scalar from a scalar z[-1] and a Python float: float64 under
// NumPy 1.x value-based promotion even for a float32 grid; it is then rounded to
// the grid's dtype when it divides the array.
template <class Real>
void stretch_to_terminal(std::vector<Real>& s, double shift_terminal) {
  const double k64 = static_cast<double>(Real(1) - s.back()) / (1.0 - shift_terminal);
  const Real k = static_cast<Real>(k64);
  for (Real& v : s) v = Real(1) - (Real(1) - v) / k;
}

template <class Real>
std::vector<float> shifted_grid(std::vector<Real> s, const FlowMatchOptions& o) {
  for (Real& v : s) v = shifted(v, o);
  if (o.shift_terminal) stretch_to_terminal(s, *o.shift_terminal);
  return std::vector<float>(s.begin(), s.end());
}

// __init__: fp32 train grid N..1, sigma = t / N, static shift in fp32 torch
// ops (unless dynamic); sigma_max/sigma_min are its ends as Python floats.
std::pair<double, double> train_sigma_range(const FlowMatchOptions& o) {
  const float n = static_cast<float>(o.num_train_timesteps);
  auto train_sigma = [&](float t) {
    float s = t / n;
    if (!o.dynamic) {
      const float shift = static_cast<float>(o.shift);
      const float shift_m1 = static_cast<float>(o.shift - 1.0);
      s = shift * s / (1.0f + shift_m1 * s);
    }
    return static_cast<double>(s);
  };
  return {train_sigma(n), train_sigma(1.0f)};
}

void check_options(const FlowMatchOptions& o) {
  if (o.num_train_timesteps < 1) fail("schedule: num_train_timesteps must be >= 1, got {}", o.num_train_timesteps);
  if (o.sigmas.empty() && o.steps < 1) fail("schedule: steps must be >= 1, got {}", o.steps);
  if (!o.dynamic && !(o.shift > 0)) fail("schedule: static shift must be > 0, got {}", o.shift);
  if (o.dynamic && o.dynamic->type == TimeShiftType::Linear && !(o.dynamic->mu > 0))
    fail("schedule: the linear time shift needs mu > 0, got {}", o.dynamic->mu);
  if (o.shift_terminal && !(*o.shift_terminal > 0 && *o.shift_terminal < 1))
    fail("schedule: shift_terminal must be in (0, 1), got {}", *o.shift_terminal);
  for (size_t i = 0; i < o.sigmas.size(); ++i)
    if (!(o.sigmas[i] > 0 && o.sigmas[i] <= 1))
      fail("schedule: passed sigma [{}] = {} is outside (0, 1]", i, o.sigmas[i]);
}

Schedule snapshot_of(const std::vector<float>& sigmas, int64_t num_train_timesteps) {
  const auto n = static_cast<int64_t>(sigmas.size());
  Schedule s{at::empty({n}, at::kFloat), at::zeros({n + 1}, at::kFloat)};
  const float scale = static_cast<float>(num_train_timesteps);
  float* t = s.timesteps.data_ptr<float>();
  float* sg = s.sigmas.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    sg[i] = sigmas[static_cast<size_t>(i)];
    t[i] = sg[i] * scale;  // one fp32 multiply, as the scheduler does on device
  }
  return s;
}

}  // namespace

Schedule flow_match_schedule(const FlowMatchOptions& o) {
  check_options(o);
  const double n_train = static_cast<double>(o.num_train_timesteps);
  std::vector<float> sigmas;
  if (o.sigmas.empty()) {
    const auto [sigma_max, sigma_min] = train_sigma_range(o);
    std::vector<double> grid = numpy_linspace(sigma_max * n_train, sigma_min * n_train, o.steps);
    for (double& v : grid) v /= n_train;
    sigmas = shifted_grid(std::move(grid), o);
  } else {
    sigmas = shifted_grid(std::vector<float>(o.sigmas.begin(), o.sigmas.end()), o);
  }
  return snapshot_of(sigmas, o.num_train_timesteps);
}

Schedule ltx2_schedule(const Ltx2Options& o) {
  if (o.steps < 1) fail("ltx2 schedule: steps must be >= 1, got {}", o.steps);
  if (o.tokens < 1) fail("ltx2 schedule: tokens must be >= 1, got {}", o.tokens);
  if (o.stretch && !(o.terminal >= 0 && o.terminal < 1))
    fail("ltx2 schedule: terminal must be in [0, 1), got {}", o.terminal);
  const double shift = resolution_mu(o.tokens, ResolutionShift{1024, 4096, o.base_shift, o.max_shift});
  const double e = std::exp(shift);
  // The reference runs these as fp32 torch ops; Python's `a / tensor` is
  // tensor.reciprocal() * a, not a true division, so it is written out here.
  at::Tensor s = at::linspace(1.0, 0.0, o.steps + 1, at::kFloat);
  at::Tensor shifted = (((s.reciprocal() - 1).add(e)).reciprocal()).mul(e);
  s = at::where(s != 0, shifted, at::zeros_like(s));
  if (o.stretch) {
    const at::Tensor nonzero = s != 0;
    const at::Tensor one_minus_z = 1.0 - s.masked_select(nonzero);
    const at::Tensor scale = one_minus_z[-1] / (1.0 - o.terminal);
    s.masked_scatter_(nonzero, 1.0 - one_minus_z / scale);
  }
  if (s[-1].item<float>() != 0.0f) fail("ltx2 schedule: the last sigma is not 0");
  std::vector<float> values(s.data_ptr<float>(), s.data_ptr<float>() + o.steps);
  return snapshot_of(values, o.num_train_timesteps);
}

}  // namespace ditrl::diffusion
