#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/sampler.hpp>
#include <ditrl/rollout/trajectory_file.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

using namespace ditrl;

namespace {

struct Setup {
  std::shared_ptr<models::Family> family;
  diffusion::Schedule schedule;
  rl::StepSelection steps;
  rollout::SampleBatch batch;
};

Setup make_setup(int64_t samples) {
  Setup s;
  models::FamilyOptions options;
  options.family = "sd3";
  options.init_seed = 3;
  s.family = models::create_family(options);
  s.schedule = models::family_schedule("sd3", {6, std::nullopt, 1, 8, 8, "tiny", ""});
  s.steps = rl::sde_window(6, 2, 0, 6, 11);
  auto prompts = rollout::synthetic_prompts(s.family->cond_spec(), 5, 0);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < samples; ++i) {
    ids.push_back(i / 2);
    s.batch.seeds.push_back(1000 + static_cast<uint64_t>(i));
  }
  s.batch.cond = prompts->fetch(ids);
  s.batch.negative = nullptr;
  s.batch.prompt_index = at::tensor(ids, at::kLong);
  s.batch.sample_index = at::arange(samples, at::kLong);
  const std::vector<int64_t> shape = s.family->latent_shape(1, {1, 8, 8});
  s.batch.latent_shape.assign(shape.begin() + 1, shape.end());
  return s;
}

rollout::Trajectories run(Setup& s, int64_t microgroup) {
  rollout::SamplerOptions options;
  options.kernel = {diffusion::SdeType::Sde, 0.7};
  options.microgroup = microgroup;
  return rollout::sample(*s.family, models::ForwardContext{}, s.schedule, s.steps, s.batch, options);
}

}  // namespace

TEST_CASE("sampler: trajectories are reproducible and keep what training needs", "[sampler]") {
  Setup s = make_setup(4);
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
