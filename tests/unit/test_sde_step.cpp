#include <ditrl/config/schema.hpp>
#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/rl/sigma_lookup.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <safetensors_reader.hpp>

using namespace ditrl::diffusion;

namespace {

ditrl::test::SafetensorsFile fixture(const std::string& name) {
  return ditrl::test::read_safetensors(std::string(DITRL_FIXTURES_DIR) + "/sde/" + name + ".safetensors");
}

// The fixture's sigmas resolved the way the trainer does: exact lookup of the
// step's timestep in the snapshot (never t / 1000).
StepSigmas resolve(const ditrl::test::SafetensorsFile& fx) {
  const Schedule snapshot{fx.at("timesteps"), fx.at("sigmas")};
  const auto entries = ditrl::rl::lookup_sigmas(snapshot, fx.at("timestep"));
  CHECK(at::equal(entries.indices, fx.at("step_index")));
  CHECK(at::equal(entries.sigmas, fx.at("sigma")));
  CHECK(at::equal(entries.sigmas_next, fx.at("sigma_prev")));
  return StepSigmas{entries.sigmas, entries.sigmas_next, snapshot.sigma(1)};
}

StepKernel kernel_of(const ditrl::test::SafetensorsFile& fx) {
  return StepKernel{ditrl::config::parse_name(kSdeNames, fx.metadata.at("kernel")).value(),
                    std::stod(fx.metadata.at("noise_level"))};
}

// max |a - b| / max(1, |b|). The log-prob is a mean over elements: its
// contract is 1e-6 relative (summation order may differ between LibTorch
// versions); with the reference's LibTorch on CPU it is bitwise equal.
double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs() / b.to(at::kDouble).abs().clamp_min(1.0)).max().item<double>();
}

}  // namespace

TEST_CASE("sde step: every shared fixture case is reproduced", "[diffusion][sde]") {
  for (const char* name : {"sde_0", "sde_1", "sde_2", "sde_3", "sde_4", "cps_0", "cps_1"}) {
    INFO(name);
    const auto fx = fixture(name);
    const StepKernel kernel = kernel_of(fx);
    const StepSigmas sigmas = resolve(fx);
    const bool generate = fx.metadata.at("mode") == "generate";
    const StepTarget target = generate ? StepTarget::noise(fx.at("noise")) : StepTarget::score(fx.at("prev_sample_in"));
    const StepResult r = sde_step(kernel, fx.at("model_output"), fx.at("sample"), sigmas, target);

    CHECK(at::equal(r.std_dev_t, fx.at("std_dev_t")));
    CHECK(at::equal(r.mean, fx.at("prev_sample_mean")));
    CHECK(at::equal(r.next, fx.at("prev_sample")));
    REQUIRE(r.log_prob.sizes() == fx.at("log_prob").sizes());
    CHECK(max_rel_error(r.log_prob, fx.at("log_prob")) <= 1e-6);

    if (generate) {  // the rollout's own draw: the fixture's noise came from this seeded CPU generator
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(std::stoull(fx.metadata.at("noise_generator_seed")));
      const StepResult drawn = sde_step(kernel, fx.at("model_output"), fx.at("sample"), sigmas, StepTarget::draw(gen));
      CHECK(at::equal(drawn.next, fx.at("prev_sample")));
      CHECK(at::equal(drawn.log_prob, r.log_prob));
    }
  }
}

TEST_CASE("sde step: rollout and training score a transition identically", "[diffusion][sde]") {
  const auto fx = fixture("sde_1");
  const StepSigmas sigmas = resolve(fx);
  for (SdeType type : {SdeType::Sde, SdeType::Cps}) {
    const StepKernel kernel{type, 0.7};
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    const StepResult rollout = sde_step(kernel, fx.at("model_output"), fx.at("sample"), sigmas, StepTarget::draw(gen));
    const StepResult train =
        sde_step(kernel, fx.at("model_output"), fx.at("sample"), sigmas, StepTarget::score(rollout.next));
    CHECK(at::equal(rollout.log_prob, train.log_prob));
    CHECK(at::equal(rollout.mean, train.mean));
  }
}

TEST_CASE("sde step: sigma == 1 uses the snapshot's sigmas[1] and gives s = eta", "[diffusion][sde]") {
  const auto fx = fixture("sde_0");
  const StepResult r = sde_step(StepKernel{SdeType::Sde, 0.7}, fx.at("model_output"), fx.at("sample"), resolve(fx),
                                StepTarget::noise(fx.at("noise")));
  CHECK(r.std_dev_t.flatten()[0].item<double>() == Approx(3.5057).margin(1e-4));
  CHECK(r.noise_std.flatten()[0].item<double>() == Approx(0.7).margin(1e-6));
}

TEST_CASE("sde step: gradients flow through the mean only / in fp32 for bf16 inputs", "[diffusion][sde]") {
  const auto fx = fixture("sde_3");
  const at::Tensor v = fx.at("model_output").clone().set_requires_grad(true);
  const StepResult r =
      sde_step(StepKernel{SdeType::Sde, 0.7}, v, fx.at("sample"), resolve(fx), StepTarget::score(fx.at("prev_sample")));
  CHECK(r.mean.scalar_type() == at::kFloat);
  CHECK(r.log_prob.scalar_type() == at::kFloat);
  CHECK_FALSE(r.next.requires_grad());
  r.log_prob.sum().backward();
  REQUIRE(v.grad().defined());
  CHECK(v.grad().abs().sum().item<double>() > 0);
}

TEST_CASE("sde step: ODE steps run deterministically and cannot be scored", "[diffusion][sde]") {
  const auto fx = fixture("sde_4");
  const StepSigmas sigmas = resolve(fx);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const StepResult r =
      sde_step(StepKernel{SdeType::Ode, 0.0}, fx.at("model_output"), fx.at("sample"), sigmas, StepTarget::draw(gen));
  const at::Tensor dt = (sigmas.sigma_next - sigmas.sigma).view({-1, 1, 1, 1});
  CHECK(at::equal(r.next, fx.at("sample") + dt * fx.at("model_output")));
  CHECK_FALSE(r.log_prob.defined());
  CHECK(r.noise_std.abs().sum().item<double>() == 0);
  // The generator was not advanced by the ODE step.
  at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(5);
  CHECK(at::equal(at::randn({4}, gen), at::randn({4}, fresh)));
  CHECK_THROWS_WITH(sde_step(StepKernel{SdeType::Ode, 0.0}, fx.at("model_output"), fx.at("sample"), sigmas,
                             StepTarget::score(fx.at("prev_sample_in"))),
                    Catch::Contains("cannot be scored"));
}

TEST_CASE("sde step: invalid inputs are errors", "[diffusion][sde]") {
  const auto fx = fixture("sde_1");
  const StepSigmas sigmas = resolve(fx);
  const at::Tensor v = fx.at("model_output");
  const at::Tensor x = fx.at("sample");
  CHECK_THROWS_WITH(sde_step(StepKernel{SdeType::Sde, 0.0}, v, x, sigmas, StepTarget::score(x)),
                    Catch::Contains("noise_level must be > 0"));
  CHECK_THROWS_WITH(sde_step(StepKernel{SdeType::Cps, 1.5}, v, x, sigmas, StepTarget::score(x)),
                    Catch::Contains("(0, 1]"));
  CHECK_THROWS_WITH(sde_step(StepKernel{SdeType::Sde, 0.7}, v, x, sigmas, StepTarget::score(x[0])),
                    Catch::Contains("x_next must have the sample's shape 3x4x6x6"));
  CHECK_THROWS_WITH(sde_step(StepKernel{SdeType::Sde, 0.7}, v, x,
                             StepSigmas{sigmas.sigma.to(at::kDouble), sigmas.sigma_next, sigmas.sigma_after_one},
                             StepTarget::score(x)),
                    Catch::Contains("fp32"));
  CHECK_THROWS_WITH(
      sde_step(StepKernel{SdeType::Sde, 0.7}, v, x,
               StepSigmas{sigmas.sigma.narrow(0, 0, 2), sigmas.sigma_next.narrow(0, 0, 2), 0.9f}, StepTarget::score(x)),
      Catch::Contains("expected 1 or the batch size 3"));
}
