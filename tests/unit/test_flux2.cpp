// FLUX.2's own checks; the fixture contract (fp32 and bf16 cases with every
// intermediate, bad checkpoints, LoRA, step-0 parity, sliced loading) is in
// test_family_contract.cpp.

#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/flux2/flux2.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <cmath>
#include <vector>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;

namespace {

std::vector<float> floats(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

}  // namespace

TEST_CASE("flux2: presets have the released parameter counts / built on the meta device", "[models][flux2]") {
  // Counted by diffusers' Flux2Transformer2DModel on the meta device with the
  // released transformer configs (docs/families.md §10.2).
  const std::vector<std::pair<std::string, int64_t>> released = {
      {"flux.2-dev", 32223281152}, {"flux.2-klein-9b", 9078581248}, {"flux.2-klein-4b", 3875544576}};
  for (const auto& [preset, count] : released) {
    INFO(preset);
    FamilyOptions o;
    o.family = "flux2";
    o.preset = preset;
    o.device = c10::kMeta;
    auto family = create_family(o);
    for (const auto& p : family->parameters()) CHECK(p.is_meta());
    CHECK(test::parameter_count(family->parameters()) == count);
    CHECK(family->named_buffers().size() == 0);  // the RoPE tables are not in the checkpoint
  }
  FamilyOptions o;
  o.family = "flux2";
  o.preset = "flux.2-dev";
  o.device = c10::kMeta;
  auto dev = create_family(o);
  const auto units = dev->wrap_units();
  REQUIRE(units.size() == 8 + 48);
  CHECK(units[8].name == "single_transformer_blocks.0");
  const auto names = dev->named_parameters();
  CHECK(names["single_transformer_blocks.47.attn.to_qkv_mlp_proj.weight"].sizes() ==
        at::IntArrayRef{3 * 6144 + 2 * 18432, 6144});
  CHECK(names["single_transformer_blocks.0.attn.to_out.weight"].sizes() == at::IntArrayRef{6144, 6144 + 18432});
  CHECK(names["transformer_blocks.7.ff.linear_in.weight"].sizes() == at::IntArrayRef{2 * 18432, 6144});
  CHECK(names["double_stream_modulation_img.linear.weight"].sizes() == at::IntArrayRef{6 * 6144, 6144});
  CHECK(names["single_stream_modulation.linear.weight"].sizes() == at::IntArrayRef{3 * 6144, 6144});
  CHECK(names["context_embedder.weight"].sizes() == at::IntArrayRef{6144, 15360});
  CHECK(names.contains("time_guidance_embed.guidance_embedder.linear_2.weight"));
  CHECK_FALSE(names.contains("proj_out.bias"));  // FLUX.2's linears have no bias
  o.preset = "flux.2-klein-4b";
  CHECK_FALSE(create_family(o)->named_parameters().contains("time_guidance_embed.guidance_embedder.linear_1.weight"));
  CHECK_THROWS_WITH(create_family((o.preset = "flux.2-pro", o)),
                    Contains("unknown flux2 preset 'flux.2-pro'") && Contains("flux.2-klein-9b"));
}

TEST_CASE("flux2: config.json loading and its errors", "[models][flux2]") {
  // FLUX.2 [klein] 4B's transformer/config.json.
  const Flux2Config c = Flux2Config::from_json(
      R"({"_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32],
      "eps": 1e-06, "guidance_embeds": false, "in_channels": 128, "joint_attention_dim": 7680, "mlp_ratio": 3.0,
      "num_attention_heads": 24, "num_layers": 5, "num_single_layers": 20, "out_channels": null, "patch_size": 1,
      "rope_theta": 2000, "timestep_guidance_channels": 256})",
      "klein/config.json");
  CHECK(c.out_channels == 128);  // `out_channels or in_channels`
  CHECK_FALSE(c.guidance_embeds);
  CHECK(c.mlp_hidden_dim() == 9216);
  const auto error = [](const std::string& text) -> std::string {
    try {
      Flux2Config::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error(R"({"num_single_layerz": 2})"), Contains("bad/config.json") && Contains("num_single_layerz"));
  CHECK_THAT(error(R"({"axes_dims_rope": [32, 32, 64]})"), Contains("4 entries"));
  CHECK_THAT(error(R"({"axes_dims_rope": [32, 32, 32, 34]})"), Contains("must sum to attention_head_dim 128"));
  CHECK_THAT(error(R"({"axes_dims_rope": [33, 31, 32, 32]})"), Contains("positive and even"));
  CHECK_THAT(error(R"({"mlp_ratio": 0})"), Contains("mlp_ratio"));
  CHECK_THAT(error(R"({"guidance_embeds": "yes"})"), Contains("guidance_embeds"));
  // What ditrl writes its reference loader reads back.
  const Flux2Config tiny = Flux2Config::preset("tiny");
  const Flux2Config again = Flux2Config::from_json(tiny.to_json(), "written");
  CHECK(again.to_json() == tiny.to_json());
}

TEST_CASE("flux2: ditrl forward takes diffusers' inputs and writes the reference's output", "[models][flux2][cli]") {
  const std::string config = fixture_path("flux2/config.json");
  const std::string weights = fixture_path("flux2/weights.safetensors");
  const std::string out = test::fresh_output_dir("flux2_cli_forward") + "/out.safetensors";
  // case_0: img_ids [1, 24, 4] and txt_ids [1, 7, 4] int64, guidance 3.5.
  const auto fwd =
      test::run_process(fmt::format("{} forward --family flux2 --config {} --weights {} --inputs {} --out {}",
                                    DITRL_BINARY, config, weights, fixture_path("flux2/case_0.safetensors"), out));
  INFO(fwd.output);
  CHECK(fwd.exit_code == 0);
  CHECK(test::fp32_ulps_off(io::SafetensorsFile(out).get("output"),
                            load_reference_case(fixture_path("flux2/case_0.safetensors")).stored.at("output")) <=
        test::fixture_fp32_ulps("flux2"));

  // Inputs that are not the pipeline's are refused naming the input.
  auto family = test::fixture_family("flux2");
  const ReferenceCase rc = load_reference_case(fixture_path("flux2/case_0.safetensors"));
  const auto refused = [&](const std::string& name, const at::Tensor& value) {
    auto inputs = rc.inputs;
    if (value.defined())
      inputs[name] = value;
    else
      inputs.erase(name);
    try {
      family->reference_forward(inputs, "{}", {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused("img_ids", rc.inputs.at("img_ids").to(at::kFloat)), Contains("'img_ids' must be an integer"));
  CHECK_THAT(refused("txt_ids", at::zeros({1, 6, 4}, at::kLong)), Contains("'txt_ids' has shape [1, 6, 4]"));
  CHECK_THAT(refused("txt_ids", {}), Contains("missing input 'txt_ids'"));
  CHECK_THAT(refused("pooled_projections", at::zeros({1, 8})), Contains("unexpected input 'pooled_projections'"));
  FamilyOptions klein;
  klein.family = "flux2";
  auto unguided_config = Flux2Config::from_json(json_config::read_file(fixture_path("flux2/config.json")), "fixture");
  unguided_config.guidance_embeds = false;
  Flux2 unguided(unguided_config, klein);
  CHECK_THROWS_WITH(unguided.reference_forward(rc.inputs, "{}", {}), Contains("no guidance embedding"));
}

TEST_CASE("flux2: noise_pred on the patchified latent equals the packed reference forward", "[models][flux2]") {
  // Packing: token row*w + col holds channel c of pixel (row, col).
  const at::Tensor latents = at::arange(2 * 3 * 4 * 6, at::kFloat).reshape({2, 3, 4, 6});
  const at::Tensor packed = flux2_pack(latents);
  REQUIRE(packed.sizes() == at::IntArrayRef{2, 24, 3});
  CHECK(packed[1][1 * 6 + 2][2].item<float>() == latents[1][2][1][2].item<float>());
  CHECK(at::equal(flux2_unpack(packed, 4, 6), latents));
  // The pipeline's ids: image (0, row, col, 0) row-major, text (0, 0, 0, j).
  const at::Tensor ids = flux2_image_ids(3, 5);
  CHECK(ids.sizes() == at::IntArrayRef{15, 4});
  CHECK(floats(ids[7]) == std::vector<float>{0, 1, 2, 0});
  CHECK(floats(flux2_text_ids(4)[3]) == std::vector<float>{0, 0, 0, 3});

  auto family = test::fixture_family("flux2");
  const ReferenceCase rc = load_reference_case(fixture_path("flux2/case_1.safetensors"));  // 3 x 5 tokens, B = 2
  CHECK(at::equal(rc.inputs.at("img_ids").select(0, 1), flux2_image_ids(3, 5)));
  CHECK(at::equal(rc.inputs.at("txt_ids").select(0, 0), flux2_text_ids(5)));
  const at::Tensor x = flux2_unpack(rc.inputs.at("hidden_states"), 3, 5);
  CHECK(family->latent_shape(2, LatentGrid{1, 6, 10}) == x.sizes().vec());
  torch::NoGradGuard no_grad;
  const at::Tensor sigma = rc.inputs.at("timestep");
  // The fixture model embeds guidance: noise_pred reads it from the conditioning (models/guided.hpp adds it).
  const at::Tensor guidance = at::full({2}, 4.0f);
  const Cond cond{{{"encoder_hidden_states", rc.inputs.at("encoder_hidden_states")}, {"guidance", guidance}}};
  const at::Tensor v = family->noise_pred(x, sigma * 1000, sigma, cond, {});
  auto inputs = rc.inputs;
  inputs["guidance"] = guidance;
  CHECK(at::equal(flux2_pack(v), family->reference_forward(inputs, "{}", {}).at("output")));
  // Trajectory timesteps are never read; one fp32 ulp of sigma is seen.
  CHECK(at::equal(v, family->noise_pred(x, at::full({2}, NAN), sigma, cond, {})));
  CHECK_FALSE(at::equal(v, family->noise_pred(x, sigma * 1000, at::nextafter(sigma, at::ones({2})), cond, {})));
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{2, 8, 8}), Contains("frames = 1"));
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{1, 7, 8}), Contains("must be even"));
}

TEST_CASE("flux2: guidance - the embedded scale is the deck's guidance_scale / real CFG only when asked",
          "[models][flux2][guidance]") {
  // case_0 embeds guidance 3.5: the guided velocity at that distilled scale is the stored reference output.
  auto dev = test::fixture_family("flux2");
  CHECK(dev->embeds_guidance());
  const ReferenceCase rc = load_reference_case(fixture_path("flux2/case_0.safetensors"));  // 4 x 6 tokens
  const Cond cond{{{"encoder_hidden_states", rc.inputs.at("encoder_hidden_states")}}};
  const at::Tensor x = flux2_unpack(rc.inputs.at("hidden_states"), 4, 6);
  const at::Tensor sigma = rc.inputs.at("timestep");
  torch::NoGradGuard no_grad;
  const auto velocity = [&](double scale) {
    GuidanceOptions g;
    g.scale = scale;
    return flux2_pack(guided_velocity(*dev, {x, sigma * 1000, sigma, &cond, nullptr, 500.0}, g, {}));
  };
  CHECK(test::fp32_ulps_off(velocity(3.5), rc.stored.at("output")) <= test::fixture_fp32_ulps("flux2"));
  // Negative control: another scale (4.0) is another output.
  CHECK(test::fp32_ulps_off(velocity(4.0), rc.stored.at("output")) > 1000);
  // With the embedding, CFG is off unless true_cfg_scale asks for it; without it ([klein]) guidance_scale is CFG.
  GuidanceOptions g;
  g.scale = 4.0;
  CHECK(dev->guidance_scale(g, 500) == 1.0);
  g.true_cfg_scale = 2.5;
  CHECK(dev->guidance_scale(g, 500) == 2.5);
  FamilyOptions klein;
  klein.family = "flux2";
  klein.preset = "flux.2-klein-4b";
  klein.device = c10::kMeta;
  g.true_cfg_scale.reset();
  CHECK(create_family(klein)->guidance_scale(g, 500) == 4.0);
}

TEST_CASE("flux2: the schedule is Flux2Pipeline's empirical mu and sigmas bit for bit", "[models][flux2][schedule]") {
  // diffusers 0.42.1: FlowMatchEulerDiscreteScheduler (FLUX.2's scheduler
  // config) .set_timesteps(sigmas=np.linspace(1, 1/n, n), mu=compute_empirical_mu(h/2 * w/2, n)).
  struct Case {
    int64_t steps, height, width;
    std::vector<float> sigmas;
  };
  const std::vector<Case> cases = {
      {3, 8, 8, {1.0f, 0.9337605834007263f, 0.7789658308029175f, 0.0f}},
      {4, 64, 64, {1.0f, 0.9580853581428528f, 0.8839818835258484f, 0.7174965739250183f, 0.0f}},
  };
  for (const Case& c : cases) {
    INFO(c.steps << " steps " << c.height << "x" << c.width);
    const diffusion::Schedule s = family_schedule("flux2", {c.steps, std::nullopt, 1, c.height, c.width, "tiny", ""});
    CHECK(floats(s.sigmas) == c.sigmas);
  }
  // Above 4300 tokens mu no longer depends on the steps: 96 x 96 tokens, 50 steps.
  const diffusion::Schedule big = family_schedule("flux2", {50, std::nullopt, 1, 192, 192, "tiny", ""});
  CHECK(big.sigma(1) == 0.9972910284996033f);
  CHECK(big.sigma(48) == 0.23841391503810883f);
  CHECK(big.sigma(49) == 0.13294564187526703f);
  CHECK_THROWS_WITH(family_schedule("flux2", {4, std::nullopt, 1, 63, 64, "tiny", ""}), Contains("must be even"));
}

TEST_CASE("flux2: units run in order / recomputable - gradients reach every parameter", "[models][flux2]") {
  FamilyOptions o;
  o.family = "flux2";
  o.init_seed = 3;
  auto family = create_family(o);
  const auto spec = family->cond_spec();
  REQUIRE(spec.size() == 1);  // no text mask: the pipelines pass none
  CHECK(spec[0].shape == std::vector<int64_t>{8, 32});
  const at::Tensor x = at::randn(family->latent_shape(2, LatentGrid{1, 6, 10}));
  CHECK(x.sizes() == at::IntArrayRef{2, 16, 3, 5});
  const at::Tensor sigma = at::tensor({0.25f, 0.75f});
  const Cond cond{{{"encoder_hidden_states", at::randn({2, 8, 32})}}};
  {
    torch::NoGradGuard no_grad;
    const at::Tensor direct = family->noise_pred(x, sigma * 1000, sigma, cond, {});
    test::RecordingRunner runner(/*repeat=*/true);
    ForwardContext ctx;
    ctx.runner = &runner;
    CHECK(at::equal(direct, family->noise_pred(x, sigma * 1000, sigma, cond, ctx)));
    CHECK(runner.order == std::vector<size_t>{0, 1, 2, 3});  // double blocks, then single blocks
    CHECK(direct.sizes() == x.sizes());
  }
  family->noise_pred(x, sigma * 1000, sigma, cond, {}).square().mean().backward();
  // The text stream feeds the single blocks, so unlike Qwen-Image every parameter is live.
  for (const auto& p : family->named_parameters()) {
    INFO(p.key());
    const at::Tensor& grad = p.value().grad();
    REQUIRE(grad.defined());
    CHECK(at::isfinite(grad).all().item<bool>());
    CHECK(grad.abs().sum().item<double>() > 0);
  }
}

TEST_CASE("flux2: RoPE tables - four axes / interleaved pairs / fp64 angles", "[models][flux2]") {
  const FluxRope rope({4, 4, 4, 4}, 2000);
  const at::Tensor ids = at::tensor({0, 2, 3, 0, 0, 0, 0, 5}, at::kLong).reshape({2, 4});
  const auto [cos, sin] = rope.cos_sin(ids);
  REQUIRE(cos.sizes() == at::IntArrayRef{2, 16});
  // Axis 1 (h = 2) pair 1: angle 2 * 2000^(-2/4), computed in fp64, stored fp32.
  const double angle = 2.0 / std::pow(2000.0, 0.5);
  CHECK(cos[0][6].item<float>() == static_cast<float>(std::cos(angle)));
  CHECK(cos[0][7].item<float>() == cos[0][6].item<float>());             // repeated for the (real, imag) pair
  CHECK(sin[1][12].item<float>() == static_cast<float>(std::sin(5.0)));  // axis 3 (l = 5), pair 0: 5 * 2000^0
  CHECK(cos[1][0].item<float>() == 1.0f);                                // t = 0: no rotation
  // x' = (x0 cos - x1 sin, x1 cos + x0 sin) per pair, heads broadcast.
  const at::Tensor x = at::randn({1, 2, 3, 16});
  const at::Tensor y = FluxRope::apply(x, cos.unsqueeze(1), sin.unsqueeze(1));
  CHECK(y[0][1][2][12].item<float>() == Approx(x[0][1][2][12].item<float>() * cos[1][12].item<float>() -
                                               x[0][1][2][13].item<float>() * sin[1][12].item<float>()));
  CHECK_THROWS_WITH(rope.cos_sin(at::zeros({2, 3}, at::kLong)), Contains("[L, 4]"));
}
