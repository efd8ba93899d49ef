#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/rollout/sampler.hpp>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <functional>
#include <memory>

namespace ditrl::rollout {

namespace {

int64_t slot_of(const std::vector<int64_t>& values, int64_t value, const char* what) {
  auto it = std::find(values.begin(), values.end(), value);
  if (it == values.end()) fail("trajectory has no {} for step {}", what, value);
  return it - values.begin();
}

bool contains(const std::vector<int64_t>& values, int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// One micro-group through every denoising step.
struct GroupResult {
  std::vector<at::Tensor> kept;                // x_i for i in return_latents, each [m, ...]
  std::vector<at::Tensor> log_probs, outputs;  // per SDE step, [m] and [m, ...]
  at::Tensor final;
};

// The parity-dump tap of step `step` of a micro-group (nullptr: record nothing).
using StepTap = std::function<std::unique_ptr<models::Tap>(int64_t step, bool trained)>;

GroupResult denoise(models::Family& family, const models::ForwardContext& ctx, const diffusion::Schedule& schedule,
                    const rl::StepSelection& steps, const models::Cond& cond, const models::Cond* negative,
                    std::vector<at::Generator>& generators, const std::vector<int64_t>& latent_shape,
                    const SamplerOptions& options, const StepTap& step_tap) {
  // Not just no-grad: inference mode also skips every op's autograd and view
  // bookkeeping (7% of a tiny rollout).
  const c10::InferenceMode inference;
  const int64_t m = static_cast<int64_t>(generators.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  std::vector<at::Tensor> initial;
  for (at::Generator& g : generators) initial.push_back(at::randn(latent_shape, g, f32));
  at::Tensor x = dist::host_to_device(at::stack(initial, 0), options.device);

  GroupResult out;
  const diffusion::StepKernel ode{diffusion::SdeType::Ode, 0.0};
  for (int64_t i = 0; i < schedule.steps(); ++i) {
    if (options.before_step) options.before_step(i);
    if (contains(steps.return_latents, i)) out.kept.push_back(x);
    // The schedule is host data: each step's values travel once, as copies.
    const auto on_device = [&](const at::Tensor& grid, int64_t k) {
      return dist::host_to_device(grid.narrow(0, k, 1).expand({m}).contiguous(), options.device);
    };
    const at::Tensor t = on_device(schedule.timesteps, i);
    const at::Tensor sigma = on_device(schedule.sigmas, i);
    const at::Tensor sigma_next = on_device(schedule.sigmas, i + 1);
    const bool sde = contains(steps.sde_steps, i);
    const std::unique_ptr<models::Tap> tap = step_tap(i, sde);
    models::ForwardContext step_ctx = ctx;
    if (tap) step_ctx.tap = tap.get();
    step_ctx.host_timesteps = schedule.timesteps.narrow(0, i, 1).expand({m});
    const at::Tensor v = models::guided_velocity(
        family, {x, t, sigma, &cond, negative, static_cast<double>(schedule.timesteps[i].item<float>())},
        options.guidance, step_ctx);
    const diffusion::StepSigmas sigmas{sigma, sigma_next, schedule.sigma(1)};
    if (sde) {
      std::vector<at::Tensor> eps;
      for (at::Generator& g : generators) eps.push_back(at::randn(latent_shape, g, f32));
      const diffusion::StepResult r =
          diffusion::sde_step(options.kernel, v, x, sigmas,
                              diffusion::StepTarget::noise(dist::host_to_device(at::stack(eps, 0), options.device)));
      rl::record_sde_step(step_ctx, r);
      out.log_probs.push_back(r.log_prob);
      out.outputs.push_back(v.to(at::kFloat));
      x = r.next;
    } else {
      // An ODE step draws nothing.
      x = diffusion::sde_step(ode, v, x, sigmas, diffusion::StepTarget::draw(at::Generator())).next;
    }
  }
  if (contains(steps.return_latents, schedule.steps())) out.kept.push_back(x);
  out.final = x;
  return out;
}

}  // namespace

int64_t Trajectories::latent_slot(int64_t step) const {
  return slot_of(steps.return_latents, step, "latent");
}
int64_t Trajectories::sde_slot(int64_t step) const {
  return slot_of(steps.sde_steps, step, "SDE log-prob");
}

namespace {

// The strategy's latents plus x_0: the initial noise is always recorded, so
// a trajectory (pure ODE included) can be replayed or inspected from its start.
rl::StepSelection with_initial_noise(rl::StepSelection steps) {
  if (!contains(steps.return_latents, 0)) steps.return_latents.insert(steps.return_latents.begin(), 0);
  return steps;
}

}  // namespace

Trajectories sample(models::Family& family, const models::ForwardContext& ctx, const diffusion::Schedule& schedule,
                    const rl::StepSelection& selected, const SampleBatch& batch, const SamplerOptions& options) {
  schedule.check("rollout schedule");
  const rl::StepSelection steps = with_initial_noise(selected);
  const int64_t n = static_cast<int64_t>(batch.seeds.size());
  if (options.microgroup <= 0 || n % options.microgroup != 0)
    fail("rollout: {} samples on this rank do not split into micro-groups of {}", n, options.microgroup);

  std::vector<at::Tensor> kept, log_probs, outputs, finals;
  for (int64_t begin = 0; begin < n; begin += options.microgroup) {
    std::vector<at::Generator> generators;
    for (int64_t s = begin; s < begin + options.microgroup; ++s)
      generators.push_back(at::detail::createCPUGenerator(batch.seeds[static_cast<size_t>(s)]));
    const models::Cond cond = batch.cond.narrow(begin, options.microgroup);
    const models::Cond negative = batch.negative ? batch.negative->narrow(begin, options.microgroup) : models::Cond{};
    std::vector<int64_t> sample_ids;
    if (options.dump) {
      const at::Tensor ids = batch.sample_index.narrow(0, begin, options.microgroup).to(at::kLong).contiguous();
      sample_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
    }
    const StepTap step_tap = [&](int64_t step, bool trained) -> std::unique_ptr<models::Tap> {
      if (!options.dump) return nullptr;
      return options.dump->tap(rl::DumpSide::Rollout, batch.rollout_id, sample_ids,
                               std::vector<int64_t>(sample_ids.size(), step), trained);
    };
    GroupResult g = denoise(family, ctx, schedule, steps, cond, batch.negative ? &negative : nullptr, generators,
                            batch.latent_shape, options, step_tap);
    // Outside inference mode the stacks copy the group into normal tensors,
    // which training may save for backward (inference tensors refuse that).
    kept.push_back(at::stack(g.kept, 1));
    if (!g.log_probs.empty()) {
      log_probs.push_back(at::stack(g.log_probs, 1));
      outputs.push_back(at::stack(g.outputs, 1));
    }
    finals.push_back(g.final);
    if (options.after_microgroup) options.after_microgroup(begin, g.final);
  }

  Trajectories out;
  out.snapshot = std::make_shared<const diffusion::Schedule>(schedule);
  out.steps = steps;
  out.latents = at::cat(kept, 0);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  out.log_probs = log_probs.empty() ? at::zeros({n, 0}, f32) : at::cat(log_probs, 0);
  out.model_outputs = outputs.empty() ? at::Tensor() : at::cat(outputs, 0);
  out.final_latents = at::cat(finals, 0);
  out.prompt_index = batch.prompt_index;
  out.sample_index = batch.sample_index;
  return out;
}

}  // namespace ditrl::rollout
