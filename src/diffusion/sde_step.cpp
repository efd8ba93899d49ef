#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace ditrl::diffusion {

StepTarget StepTarget::draw(at::Generator generator) {
  StepTarget t;
  t.kind_ = Kind::Draw;
  t.generator_ = std::move(generator);
  return t;
}

StepTarget StepTarget::noise(at::Tensor eps) {
  StepTarget t;
  t.kind_ = Kind::Noise;
  t.tensor_ = std::move(eps);
  return t;
}

StepTarget StepTarget::score(at::Tensor x_next) {
  StepTarget t;
  t.kind_ = Kind::Score;
  t.tensor_ = std::move(x_next);
  return t;
}

namespace {

void check_inputs(const StepKernel& kernel, const at::Tensor& velocity, const at::Tensor& sample,
                  const StepSigmas& sigmas, const StepTarget& target) {
  const std::string_view kind = name_of(kSdeNames, kernel.type);
  if (!sample.defined() || !velocity.defined()) fail("{} step: sample and velocity must be defined", kind);
  if (sample.dim() < 2)
    fail("{} step: sample must be (B, ...) with at least one non-batch dim, got {}", kind,
         fmt::join(sample.sizes(), "x"));
  if (velocity.sizes() != sample.sizes())
    fail("{} step: velocity {} and sample {} differ in shape", kind, fmt::join(velocity.sizes(), "x"),
         fmt::join(sample.sizes(), "x"));
  if (!sample.is_floating_point() || !velocity.is_floating_point())
    fail("{} step: sample and velocity must be floating point", kind);
  const int64_t batch = sample.size(0);
  for (const auto& [name, s] : {std::pair{"sigma", sigmas.sigma}, std::pair{"sigma_next", sigmas.sigma_next}}) {
    if (!s.defined() || s.dim() != 1 || s.scalar_type() != at::kFloat)
      fail("{} step: {} must be a 1-D fp32 tensor from the rollout snapshot", kind, name);
    if (s.size(0) != 1 && s.size(0) != batch)
      fail("{} step: {} has {} entries, expected 1 or the batch size {}", kind, name, s.size(0), batch);
  }
  if (sigmas.sigma.size(0) != sigmas.sigma_next.size(0))
    fail("{} step: sigma ({}) and sigma_next ({}) differ in length", kind, sigmas.sigma.size(0),
         sigmas.sigma_next.size(0));
  if (kernel.type == SdeType::Sde && !(kernel.noise_level > 0))
    fail("sde step: noise_level must be > 0 (the Gaussian log-prob needs a positive std), got {}", kernel.noise_level);
  if (kernel.type == SdeType::Cps && !(kernel.noise_level > 0 && kernel.noise_level <= 1))
    fail("cps step: noise_level must be in (0, 1], got {}", kernel.noise_level);
  if (kernel.type == SdeType::Ode && target.kind() == StepTarget::Kind::Score)
    fail("ode step: an ODE step has no transition density; it cannot be scored (train only SDE/CPS steps)");
  if (target.kind() != StepTarget::Kind::Draw) {
    const at::Tensor& t = target.tensor();
    const char* name = target.kind() == StepTarget::Kind::Score ? "x_next" : "noise";
    if (!t.defined() || t.sizes() != sample.sizes())
      fail("{} step: {} must have the sample's shape {}, got {}", kind, name, fmt::join(sample.sizes(), "x"),
           t.defined() ? fmt::format("{}", fmt::join(t.sizes(), "x")) : std::string("undefined"));
  }
}

// Each expression below follows the reference's operation order and operand
// types (fp32 tensors, Python floats as fp32 scalars) so the results are the
// reference's bits, not merely close.
StepResult flow_sde(double eta, const at::Tensor& x, const at::Tensor& v, const at::Tensor& sigma,
                    const at::Tensor& sigma_next, float sigma_after_one) {
  const at::Tensor dt = sigma_next - sigma;
  const at::Tensor den = 1 - at::where(sigma == 1, at::full_like(sigma, sigma_after_one), sigma);
  StepResult r;
  r.std_dev_t = at::sqrt(sigma / den) * eta;
  const at::Tensor var = r.std_dev_t.pow(2);
  r.mean = x * (1 + var / (2 * sigma) * dt) + v * (1 + var * (1 - sigma) / (2 * sigma)) * dt;
  r.noise_std = r.std_dev_t * at::sqrt(-1 * dt);
  return r;
}

StepResult flow_cps(double eta, const at::Tensor& x, const at::Tensor& v, const at::Tensor& sigma,
                    const at::Tensor& sigma_next) {
  StepResult r;
  r.std_dev_t = sigma_next * std::sin(eta * M_PI / 2);
  const at::Tensor x0_hat = x - sigma * v;
  const at::Tensor x1_hat = x + v * (1 - sigma);
  r.mean = x0_hat * (1 - sigma_next) + x1_hat * at::sqrt(sigma_next.pow(2) - r.std_dev_t.pow(2));
  r.noise_std = r.std_dev_t;
  return r;
}

at::Tensor gaussian_log_prob(const at::Tensor& next, const at::Tensor& mean, const at::Tensor& s) {
  // A 0-dim host tensor: ops on GPU tensors read it as a scalar argument, where a copy to the GPU
  // (from pageable memory) would make the host wait at every SDE step.
  const at::Tensor log_sqrt_2pi = at::log(at::sqrt(2 * at::scalar_tensor(M_PI, at::kFloat)));
  return -(next - mean).pow(2) / (2 * s.pow(2)) - at::log(s) - log_sqrt_2pi;
}

std::vector<int64_t> non_batch_dims(const at::Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

}  // namespace

StepResult sde_step(const StepKernel& kernel, const at::Tensor& velocity, const at::Tensor& sample,
                    const StepSigmas& sigmas, const StepTarget& target) {
  check_inputs(kernel, velocity, sample, sigmas, target);
  const at::Tensor x = sample.to(at::kFloat);
  const at::Tensor v = velocity.to(at::kFloat);
  std::vector<int64_t> view(static_cast<size_t>(sample.dim()), 1);
  view[0] = sigmas.sigma.size(0);
  const at::Tensor sigma = sigmas.sigma.to(sample.device()).view(view);
  const at::Tensor sigma_next = sigmas.sigma_next.to(sample.device()).view(view);

  StepResult r;
  switch (kernel.type) {
    case SdeType::Sde:
      r = flow_sde(kernel.noise_level, x, v, sigma, sigma_next, sigmas.sigma_after_one);
      break;
    case SdeType::Cps:
      r = flow_cps(kernel.noise_level, x, v, sigma, sigma_next);
      break;
    case SdeType::Ode:
      r.mean = x + (sigma_next - sigma) * v;
      r.noise_std = at::zeros_like(sigma);
      r.std_dev_t = r.noise_std;
      r.next = r.mean.detach();
      return r;
  }

  switch (target.kind()) {
    case StepTarget::Kind::Draw: {
      // Drawn by the generator's own device (a CPU generator for a GPU step:
      // the same noise on either) and copied to the step's.
      const at::Generator& gen = target.generator();
      const at::Tensor eps =
          at::randn(sample.sizes(), gen, x.options().device(gen.defined() ? gen.device() : x.device())).to(x.device());
      r.next = (r.mean + r.noise_std * eps).detach();
      break;
    }
    case StepTarget::Kind::Noise:
      r.next = (r.mean + r.noise_std * target.tensor().to(x.options())).detach();
      break;
    case StepTarget::Kind::Score:
      r.next = target.tensor().to(x.options()).detach();
      break;
  }
  const at::Tensor elementwise =
      kernel.type == SdeType::Sde ? gaussian_log_prob(r.next, r.mean, r.noise_std) : -(r.next - r.mean).pow(2);
  r.log_prob = elementwise.mean(non_batch_dims(elementwise));
  return r;
}

}  // namespace ditrl::diffusion
