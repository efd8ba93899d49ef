#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/rl/sigma_lookup.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/sampler.hpp>
#include <ditrl/rollout/trajectory_file.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <catch2/catch.hpp>

using namespace ditrl;

namespace {

struct Setup {
  std::shared_ptr<models::Family> family;
  diffusion::Schedule schedule;
  rl::StepSelection steps;
  rollout::SampleBatch batch;
  models::Cond negative;
};

Setup make_setup(int64_t samples, c10::ScalarType forward) {
  Setup s;
  models::FamilyOptions options;
  options.family = "sd3";
  options.init_seed = 3;
  using precision::InputDtype;
  options.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, forward);
  s.family = models::create_family(options);
  if (forward != at::kFloat) s.family->to(forward);
  s.schedule = models::family_schedule("sd3", {6, std::nullopt, 1, 8, 8});
  s.steps = rl::sde_window(6, 2, 0, 6, 11);
  auto prompts = rollout::synthetic_prompts(s.family->cond_spec(), 5, 0);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < samples; ++i) {
    ids.push_back(i / 2);
    s.batch.seeds.push_back(1000 + static_cast<uint64_t>(i));
  }
  s.batch.cond = prompts->fetch(ids);
  s.negative = prompts->negative(samples);
  s.batch.negative = nullptr;
  s.batch.prompt_index = at::tensor(ids, at::kLong);
  s.batch.sample_index = at::arange(samples, at::kLong);
  const std::vector<int64_t> shape = s.family->latent_shape(1, {1, 8, 8});
  s.batch.latent_shape.assign(shape.begin() + 1, shape.end());
  return s;
}

rollout::Trajectories run(Setup& s, int64_t microgroup, double guidance = 1.0) {
  rollout::SamplerOptions options;
  options.kernel = {diffusion::SdeType::Sde, 0.7};
  options.microgroup = microgroup;
  options.guidance.scale = guidance;
  s.batch.negative = guidance > 1.0 ? &s.negative : nullptr;
  return rollout::sample(*s.family, models::ForwardContext{}, s.schedule, s.steps, s.batch, options);
}

}  // namespace

TEST_CASE("sampler: trajectories are reproducible and keep what training needs", "[sampler]") {
  Setup s = make_setup(4, at::kFloat);
  const rollout::Trajectories a = run(s, 2), b = run(s, 2);
  CHECK(at::equal(a.final_latents, b.final_latents));
  CHECK(at::equal(a.log_probs, b.log_probs));
  CHECK(a.latents.sizes() == at::IntArrayRef{4, static_cast<int64_t>(s.steps.return_latents.size()), 16, 8, 8});
  CHECK(a.log_probs.sizes() == at::IntArrayRef{4, 2});
  CHECK(a.model_outputs.sizes() == at::IntArrayRef{4, 2, 16, 8, 8});
  CHECK(at::isfinite(a.final_latents).all().item<bool>());
  // A sample's trajectory does not depend on its micro-group (up to GEMM
  // rounding, which varies with the batch size in fp32 BLAS).
  const rollout::Trajectories c = run(s, 1);
  CHECK(at::allclose(a.final_latents, c.final_latents, 1e-4, 1e-5));
}

TEST_CASE("sampler: re-scoring a rollout step on the same micro-group gives the rollout's log-prob bitwise",
          "[sampler][parity]") {
  for (c10::ScalarType forward : {at::kFloat, at::kBFloat16}) {
    for (double guidance : {1.0, 4.0}) {
      Setup s = make_setup(4, forward);
      const rollout::Trajectories t = run(s, 2, guidance);
      for (int64_t step : s.steps.sde_steps) {
        const int64_t k = t.latent_slot(step), k1 = t.latent_slot(step + 1), j = t.sde_slot(step);
        for (int64_t begin = 0; begin < 4; begin += 2) {
          const at::Tensor x = t.latents.narrow(0, begin, 2).select(1, k);
          const at::Tensor x_next = t.latents.narrow(0, begin, 2).select(1, k1);
          const at::Tensor ts = s.schedule.timesteps.narrow(0, step, 1).expand({2}).contiguous();
          const rl::SnapshotEntries e = rl::lookup_sigmas(*t.snapshot, ts);
          models::Cond cond, neg;
          for (const auto& [name, tensor] : s.batch.cond.tensors) cond.tensors[name] = tensor.narrow(0, begin, 2);
          for (const auto& [name, tensor] : s.negative.tensors) neg.tensors[name] = tensor.narrow(0, begin, 2);
          models::GuidanceOptions g;
          g.scale = guidance;
          const at::Tensor v = models::guided_velocity(*s.family, {x, e.timesteps, e.sigmas, &cond, &neg}, g, {});
          const diffusion::StepResult r =
              diffusion::sde_step({diffusion::SdeType::Sde, 0.7}, v, x, {e.sigmas, e.sigmas_next, t.snapshot->sigma(1)},
                                  diffusion::StepTarget::score(x_next));
          CHECK(at::equal(v.to(at::kFloat), t.model_outputs.narrow(0, begin, 2).select(1, j)));
          CHECK(at::equal(r.log_prob, t.log_probs.narrow(0, begin, 2).select(1, j)));
        }
      }
    }
  }
}

// Trajectories read from a file (Collector::load) must be where sampled ones
// are: on a GPU, training subtracts the rollout's velocities from its own
// forward's. Checked with the meta device, which needs no GPU.
TEST_CASE("sampler: read trajectories go to the device as sampled ones do and their indices stay on the host",
          "[sampler][device]") {
  rollout::Trajectories t;
  t.latents = at::zeros({2, 3, 4});
  t.log_probs = at::zeros({2, 1});
  t.final_latents = at::zeros({2, 4});
  t.prompt_index = at::arange(2, at::kLong);
  t.sample_index = at::arange(2, at::kLong);
  t.rewards = at::zeros({2});
  const rollout::Trajectories placed = rollout::to_device(t, c10::kMeta);
  for (const at::Tensor* x : {&placed.latents, &placed.log_probs, &placed.final_latents}) CHECK(x->is_meta());
  for (const at::Tensor* x : {&placed.prompt_index, &placed.sample_index, &placed.rewards}) CHECK(x->is_cpu());
  CHECK_FALSE(placed.model_outputs.defined());
  t.model_outputs = at::zeros({2, 1, 4});
  CHECK(rollout::to_device(t, c10::kMeta).model_outputs.is_meta());
}
