// FLUX.1 checks that belong to this family alone (the fixture contract is in
// test_family_contract.cpp): released parameter counts, config.json, the
// `ditrl forward` inputs, noise_pred's packing and pipeline ids, the
// distilled guidance input, and FluxPipeline's shifted sigma schedule.

#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/flux/flux.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/packed_latents.hpp>
#include <ditrl/models/reference.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;

namespace {

Cond flux_cond(const ReferenceCase& c) {
  return Cond{{{"encoder_hidden_states", c.inputs.at("encoder_hidden_states")},
               {"pooled_projections", c.inputs.at("pooled_projections")}}};
}

}  // namespace

TEST_CASE("flux: the presets have the released parameter counts / built on the meta device", "[models][flux]") {
  FamilyOptions o;
  o.family = "flux";
  o.device = c10::kMeta;
  // diffusers FluxTransformer2DModel on the meta device: 11901408320 with
  // the guidance embedder (FLUX.1-dev), 11891178560 without (-schnell).
  for (const auto& [preset, count] :
       {std::pair{"flux.1-dev", int64_t{11901408320}}, std::pair{"flux.1-schnell", int64_t{11891178560}}}) {
    INFO(preset);
    o.preset = preset;
    auto family = create_family(o);
    for (const auto& p : family->parameters()) CHECK(p.is_meta());
    CHECK(test::parameter_count(family->parameters()) == count);
    const auto units = family->wrap_units();
    REQUIRE(units.size() == 19 + 38);
    CHECK(units[19].name == "single_transformer_blocks.0");
    const auto names = family->named_parameters();
    CHECK(names["single_transformer_blocks.37.proj_out.weight"].sizes() == at::IntArrayRef{3072, 5 * 3072});
    CHECK(names["transformer_blocks.18.norm1_context.linear.weight"].sizes() == at::IntArrayRef{6 * 3072, 3072});
    CHECK(names["x_embedder.weight"].sizes() == at::IntArrayRef{3072, 64});
    CHECK(names.contains("time_text_embed.guidance_embedder.linear_1.weight") == (std::string(preset) == "flux.1-dev"));
    CHECK_FALSE(names.contains("single_transformer_blocks.0.attn.to_out.0.weight"));  // pre_only attention
    CHECK(family->named_buffers().size() == 0);  // the RoPE tables are not in the checkpoint
  }
  CHECK_THROWS_WITH(create_family((o.preset = "flux.1-pro", o)),
                    Contains("unknown flux preset 'flux.1-pro'") && Contains("flux.1-schnell"));
}

TEST_CASE("flux: config.json loading and its errors", "[models][flux]") {
  const FluxConfig c = FluxConfig::from_json(
      R"({"_class_name": "FluxTransformer2DModel", "attention_head_dim": 16, "axes_dims_rope": [4, 6, 6],
      "guidance_embeds": false, "in_channels": 16, "joint_attention_dim": 24, "num_attention_heads": 2,
      "num_layers": 1, "num_single_layers": 3, "out_channels": null, "patch_size": 1, "pooled_projection_dim": 8})",
      "config.json");
  CHECK(c.out_channels == 16);  // `out_channels or in_channels`
  CHECK_FALSE(c.guidance_embeds);
  CHECK(c.num_single_layers == 3);
  CHECK(FluxConfig::from_json(c.to_json(), "written").to_json() == c.to_json());
  const auto error = [](const std::string& text) -> std::string {
    try {
      FluxConfig::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error(R"({"num_single_layerz": 2})"),
             Contains("bad/config.json") && Contains("unknown") && Contains("num_single_layerz"));
  CHECK_THAT(error(R"({"axes_dims_rope": [16, 56, 58]})"), Contains("must sum to attention_head_dim 128"));
  CHECK_THAT(error(R"({"axes_dims_rope": [16, 56, 32, 24]})"), Contains("3 entries"));
  CHECK_THAT(error(R"({"guidance_embeds": "yes"})"), Contains("guidance_embeds"));
}

TEST_CASE("flux: ditrl forward takes diffusers' inputs and writes the reference's output", "[models][flux][cli]") {
  const std::string config = fixture_path("flux/config.json");
  const std::string dir = test::fresh_output_dir("flux_cli_forward");
  const auto forward = [&](const std::string& inputs) {
    return test::run_process(
        fmt::format("{} forward --family flux --config {} --weights {} --inputs {} --out {} "
                    "--threads 1",
                    DITRL_BINARY, config, fixture_path("flux/weights.safetensors"), inputs, dir + "/out.safetensors"));
  };
  const auto fwd = forward(fixture_path("flux/case_0.safetensors"));
  INFO(fwd.output);
  CHECK(fwd.exit_code == 0);
  CHECK(test::fp32_ulps_off(io::SafetensorsFile(dir + "/out.safetensors").get("output"),
                            load_reference_case(fixture_path("flux/case_0.safetensors")).stored.at("output")) <=
        test::fixture_fp32_ulps("flux"));
  // Without `guidance` the guidance-distilled model refuses, naming the input.
  io::NamedTensors inputs;
  const ReferenceCase c = load_reference_case(fixture_path("flux/case_0.safetensors"));
  for (const auto& [name, t] : c.inputs)
    if (name != "guidance") inputs.emplace_back(name, t);
  io::write_safetensors(dir + "/no_guidance.safetensors", inputs);
  const auto refused = forward(dir + "/no_guidance.safetensors");
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.output, Contains("missing input 'guidance'"));
}

TEST_CASE("flux: noise_pred packs the latents with the pipeline's ids and embeds the guidance scale",
          "[models][flux]") {
  auto family = test::fixture_family("flux");
  CHECK(family->embeds_guidance());
  CHECK(family->timestep_domain() == TimestepDomain::Sigma);
  // case_0: a 3x4-token grid (6x8 latents), the pipeline's ids, guidance 3.5 and 2.0.
  const ReferenceCase rc = load_reference_case(fixture_path("flux/case_0.safetensors"));
  CHECK(at::equal(rc.inputs.at("img_ids"), flux_image_ids(3, 4, at::kFloat)));
  const at::Tensor latents = unpack_latents(rc.inputs.at("hidden_states"), 6, 8, 2);
  CHECK(family->latent_shape(2, LatentGrid{1, 6, 8}) == latents.sizes().vec());
  torch::NoGradGuard no_grad;
  const at::Tensor sigma = rc.inputs.at("timestep");
  Cond cond = flux_cond(rc);
  cond.tensors["guidance"] = rc.inputs.at("guidance");
  const at::Tensor reference = run_reference_case(*family, rc, false).at("output");
  const at::Tensor v = family->noise_pred(latents, sigma * 1000, sigma, cond, {});
  CHECK(at::equal(pack_latents(v, 2), reference));
  // The trajectory timesteps are never read.
  CHECK(at::equal(family->noise_pred(latents, at::zeros_like(sigma), sigma, cond, {}), v));
  // guided_velocity passes GuidanceOptions::scale as `guidance`: the first
  // sample's 3.5 reproduces it, the second's 2.0 does not (negative control).
  GuidanceOptions g;
  g.scale = 3.5;
  const Cond plain = flux_cond(rc);
  const at::Tensor guided = guided_velocity(*family, {latents, sigma * 1000, sigma, &plain, nullptr, 0}, g, {});
  CHECK(at::equal(guided[0], v[0]));
  CHECK_FALSE(at::equal(guided[1], v[1]));
  // DiffusionNFT and SFT forwards (no CFG) embed the same scale.
  const at::Tensor unguided = unguided_velocity(*family, {latents, sigma * 1000, sigma, &plain, nullptr, 0}, g, {});
  CHECK(at::equal(unguided, guided));
  // CFG stays off with the distilled guidance; true_cfg_scale > 1 turns real CFG on.
  CHECK_FALSE(uses_cfg(*family, g, 500));
  g.true_cfg_scale = 4.0;
  CHECK(uses_cfg(*family, g, 500));
  // Real CFG (FluxPipeline's do_true_cfg): neg + true_cfg_scale (pos - neg), both halves at the distilled guidance.
  Cond negative = plain;
  // (Reordering the text would not do: with zero txt_ids the text tokens carry no position.)
  negative.tensors["encoder_hidden_states"] = plain.at("encoder_hidden_states").neg();
  Cond pos_g = plain, neg_g = negative;
  pos_g.tensors["guidance"] = neg_g.tensors["guidance"] = at::full({2}, 3.5);
  const at::Tensor pos = family->noise_pred(latents, sigma * 1000, sigma, pos_g, {});
  const at::Tensor neg = family->noise_pred(latents, sigma * 1000, sigma, neg_g, {});
  const at::Tensor cfg = guided_velocity(*family, {latents, sigma * 1000, sigma, &plain, &negative, 0}, g, {});
  // The joint [pos; neg] batch against two separate forwards: measured 8.7e-6 (outputs up to 6.3); bound 10x.
  CHECK((cfg - (neg + 4.0 * (pos - neg))).abs().max().item<double>() <= 1e-4);
  CHECK((cfg - pos).abs().max().item<double>() > 1e-2);  // the negative prompt moves it
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{1, 7, 8}), Contains("must be even"));
  CHECK_THROWS_WITH(family->noise_pred(latents, sigma, sigma, plain, {}), Contains("guidance"));
}

TEST_CASE("flux: the schedule is FluxPipeline's linspace sigmas with calculate_shift's mu", "[models][flux]") {
  // diffusers 0.42.1 FlowMatchEulerDiscreteScheduler with FLUX.1-dev's
  // config, set_timesteps(sigmas=np.linspace(1, 1/4, 4), mu=calculate_shift(1024))
  // at 64x64 latents (mu = 0.63).
  diffusion::SchedulePresetOptions p;
  p.steps = 4;
  p.height = 64;
  p.width = 64;
  const diffusion::Schedule s = family_schedule("flux", p);
  const std::vector<float> sigmas = {1.0f, 0.8492348194122314f, 0.652489423751831f, 0.38494473695755005f, 0.0f};
  const std::vector<float> timesteps = {1000.0f, 849.2348022460938f, 652.4894409179688f, 384.9447326660156f};
  for (size_t i = 0; i < sigmas.size(); ++i) CHECK(s.sigma(static_cast<int64_t>(i)) == sigmas[i]);
  for (size_t i = 0; i < timesteps.size(); ++i) CHECK(s.timestep(static_cast<int64_t>(i)) == timesteps[i]);
  CHECK(diffusion::resolution_mu(1024, diffusion::ResolutionShift{256, 4096, 0.5, 1.15}) == Approx(0.63));
  p.height = 15;
  CHECK_THROWS_WITH(family_schedule("flux", p), Contains("must be even"));
}

TEST_CASE("flux: FLUX.1-schnell samples on the pipeline's linspace without the dynamic shift", "[models][flux]") {
  // diffusers 0.42.1 FlowMatchEulerDiscreteScheduler with FLUX.1-schnell's
  // config (use_dynamic_shifting = false, shift = 1.0),
  // set_timesteps(sigmas=np.linspace(1, 1/4, 4), mu=0.7): the mu is ignored.
  diffusion::SchedulePresetOptions p;
  p.steps = 4;
  p.height = 64;
  p.width = 64;
  const std::vector<float> sigmas = {1.0f, 0.75f, 0.5f, 0.25f, 0.0f};
  for (const std::string preset : {"flux.1-schnell", "tiny-schnell"}) {
    p.preset = preset;
    const diffusion::Schedule s = family_schedule("flux", p);
    for (size_t i = 0; i < sigmas.size(); ++i) CHECK(s.sigma(static_cast<int64_t>(i)) == sigmas[i]);
    CHECK(s.timestep(1) == 750.0f);
  }
  // A config.json without the guidance embedder is schnell too; dev's is shifted (the negative control).
  const std::string dir = test::fresh_output_dir("flux_schnell_schedule");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  p.preset = "tiny";
  p.config_json = write("schnell.json", FluxConfig::preset("tiny-schnell").to_json());
  CHECK(family_schedule("flux", p).sigma(1) == 0.75f);
  p.config_json = write("dev.json", FluxConfig::preset("tiny").to_json());
  CHECK(family_schedule("flux", p).sigma(1) == 0.8492348194122314f);
}
