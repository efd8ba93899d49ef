#include <ditrl/cuda_build.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/models/weights.hpp>

#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <set>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;
using test::max_abs_diff;

namespace {

// Counts and forwards unit calls; `repeat` runs each unit twice like a
// recomputing sharded runner would.
class CountingRunner : public UnitRunner {
 public:
  explicit CountingRunner(bool repeat) : repeat_(repeat) {}
  Tensors run(size_t index, const Tensors& inputs, const UnitFn& fn) override {
    order.push_back(index);
    if (repeat_) {
      TapSuppressGuard quiet;
      (void)fn(inputs);
    }
    return fn(inputs);
  }
  std::vector<size_t> order;

 private:
  bool repeat_;
};

Cond sd3_cond(const ReferenceCase& c) {
  return Cond{{{"encoder_hidden_states", c.inputs.at("encoder_hidden_states")},
               {"pooled_projections", c.inputs.at("pooled_projections")}}};
}

}  // namespace

TEST_CASE("sd3: presets have the released parameter counts / built on the meta device", "[models][sd3]") {
  struct Expected {
    const char* preset;
    int64_t params;
    int64_t pos_embed;
  };
  // docs/families.md §1.2 (trainable parameters, persistent pos_embed buffer).
  for (const Expected& e : {Expected{"sd3-medium", 2028328000, 1536LL * 192 * 192},
                            Expected{"sd3.5-medium", 2243171520, 1536LL * 384 * 384},
                            Expected{"sd3.5-large", 8056627520, 2432LL * 192 * 192}}) {
    INFO(e.preset);
    FamilyOptions o;
    o.family = "sd3";
    o.preset = e.preset;
    o.device = c10::kMeta;
    auto family = create_family(o);
    for (const auto& p : family->parameters()) CHECK(p.is_meta());
    CHECK(test::parameter_count(family->parameters()) == e.params);
    CHECK(family->named_buffers()["pos_embed.pos_embed"].numel() == e.pos_embed);
    CHECK(family->wrap_units().size() == (std::string(e.preset) == "sd3.5-large" ? 38u : 24u));
  }
  FamilyOptions o;
  o.family = "sd3";
  o.device = c10::kMeta;
  auto medium = create_family((o.preset = "sd3.5-medium", o));
  const auto names = medium->named_parameters();
  CHECK(names.contains("transformer_blocks.12.attn2.to_q.weight"));
  CHECK_FALSE(names.contains("transformer_blocks.13.attn2.to_q.weight"));
  CHECK_FALSE(names.contains("transformer_blocks.23.attn.to_add_out.weight"));
  CHECK(names["transformer_blocks.23.norm1_context.linear.weight"].sizes() == at::IntArrayRef{2 * 1536, 1536});
  CHECK(names["transformer_blocks.0.norm1.linear.weight"].sizes() == at::IntArrayRef{9 * 1536, 1536});
  CHECK_THROWS_WITH(create_family((o.preset = "sd4", o)),
                    Contains("unknown sd3 preset 'sd4'") && Contains("sd3.5-large"));
}

TEST_CASE("sd3: config.json loading and its errors", "[models][sd3]") {
  const SD3Config c = SD3Config::from_json(R"({"_class_name": "SD3Transformer2DModel", "attention_head_dim": 16,
      "caption_projection_dim": 64, "dual_attention_layers": [0], "in_channels": 4, "joint_attention_dim": 32,
      "num_attention_heads": 4, "num_layers": 2, "out_channels": 4, "patch_size": 2, "pooled_projection_dim": 24,
      "pos_embed_max_size": 16, "qk_norm": "rms_norm", "sample_size": 16})",
                                           "config.json");
  CHECK(c.inner_dim() == 64);
  CHECK(c.dual(0));
  CHECK_FALSE(c.dual(1));
  CHECK(c.qk_norm);
  CHECK(SD3Config::from_json(R"({"qk_norm": null, "num_layers": 3})", "c.json").num_layers == 3);
  const auto error = [](const std::string& text) -> std::string {
    try {
      SD3Config::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error(R"({"num_layerz": 2})"),
             Contains("bad/config.json") && Contains("unknown") && Contains("num_layerz"));
  CHECK_THAT(error(R"({"num_layers": "two"})"), Contains("'num_layers' must be an integer"));
  CHECK_THAT(error(R"({"qk_norm": "layer_norm"})"), Contains("qk_norm"));
  CHECK_THAT(error(R"({"caption_projection_dim": 100})"), Contains("caption_projection_dim 100 must equal"));
  CHECK_THAT(error(R"({"dual_attention_layers": [40]})"), Contains("dual attention layer 40"));
  CHECK_THAT(error(R"({"pos_embed_max_size": null})"), Contains("pos_embed_max_size"));
  CHECK_THAT(error("{"), Contains("bad/config.json") && Contains("not valid JSON"));
}

TEST_CASE("sd3: pos_embed comes from the checkpoint / or the exact fp32-coordinate recipe", "[models][sd3]") {
  const io::SafetensorsFile weights(fixture_path("sd3/weights.safetensors"));
  FamilyOptions o;
  o.family = "sd3";
  o.config_json = fixture_path("sd3/config.json");
  auto computed = create_family(o);
  CHECK(at::equal(computed->named_buffers()["pos_embed.pos_embed"], weights.get("pos_embed.pos_embed")));
  io::NamedTensors without;
  for (const std::string& name : weights.names())
    if (name != "pos_embed.pos_embed") without.emplace_back(name, weights.get(name));
  const std::string path = test::fresh_output_dir("sd3_no_pos_embed") + "/w.safetensors";
  io::write_safetensors(path, without);
  load_weights(*computed, io::Checkpoint(path));  // the buffer is optional
  const ReferenceCase c = load_reference_case(fixture_path("sd3/case_1.safetensors"));
  auto loaded = test::fixture_family("sd3");
  CHECK(at::equal(run_reference_case(*computed, c, false).at("output"),
                  run_reference_case(*loaded, c, false).at("output")));
}

TEST_CASE("sd3: noise_pred reads the trajectory timesteps t / never sigma", "[models][sd3]") {
  // The rollout ships two arrays: the timesteps t the scheduler fed the DiT
  // and the sigma snapshot. They are rounded separately (docs/algorithms.md §1.3):
  // the scheduler computes sigma in float64 and t = fl32(sigma64 * 1000) with
  // one rounding, while the snapshot stores fl32(sigma64), and
  // fl32(fl32(sigma64) * 1000) can land an ulp away from t. Deriving one
  // array from the other therefore changes the model input, so each family
  // reads the array of its own domain. SD3 embeds t.
  auto family = test::fixture_family("sd3");
  const ReferenceCase c = load_reference_case(fixture_path("sd3/case_1.safetensors"));
  const at::Tensor x = c.inputs.at("hidden_states");
  // SD3.5 schedule, shift 3, 10 steps, step 1: sigma64 = 0.8573264781491003.
  const at::Tensor t = at::tensor({857.3264770507812f, 857.3264770507812f});
  const at::Tensor sigma = at::tensor({0.8573265075683594f, 0.8573265075683594f});
  const at::Tensor t_from_sigma = sigma * 1000;  // 857.3265380859375: one ulp above t
  REQUIRE_FALSE(at::equal(t_from_sigma, t));
  torch::NoGradGuard no_grad;
  const ForwardContext ctx;
  const at::Tensor v = family->noise_pred(x, t, sigma, sd3_cond(c), ctx);
  const auto reference = [&](const at::Tensor& timestep) {
    auto inputs = c.inputs;
    inputs["timestep"] = timestep;
    return family->reference_forward(inputs, "{}", ctx).at("output");
  };
  CHECK(at::equal(v, reference(t)));
  CHECK_FALSE(at::equal(v, reference(t_from_sigma)));  // one ulp of t is visible in the velocity
  CHECK(at::equal(v, family->noise_pred(x, t, at::full({2}, NAN), sd3_cond(c), ctx)));
  CHECK(family->timestep_domain() == TimestepDomain::Timestep);
}

TEST_CASE("sd3: noise_pred applies the input policy at the boundary", "[models][sd3]") {
  FamilyOptions o;
  using precision::InputDtype;
  o.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, at::kBFloat16);
  auto family = test::fixture_family("sd3", o);
  cast_parameters(*family, at::kBFloat16, family->default_overrides());
  const ReferenceCase c = load_reference_case(fixture_path("sd3/case_0.safetensors"));
  torch::NoGradGuard no_grad;
  const at::Tensor v = family->noise_pred(c.inputs.at("hidden_states"), c.inputs.at("timestep"),
                                          c.inputs.at("timestep"), sd3_cond(c), {});
  CHECK(v.scalar_type() == at::kBFloat16);
  auto inputs = c.inputs;
  for (const char* name : {"hidden_states", "encoder_hidden_states", "pooled_projections"})
    inputs[name] = inputs[name].to(at::kBFloat16);
  CHECK(at::equal(v, family->reference_forward(inputs, "{}", {}).at("output")));
  CHECK(family->default_input_policy(at::kBFloat16).timestep == std::nullopt);
}

TEST_CASE("sd3: every block runs through the unit runner / in order / recomputable", "[models][sd3]") {
  FamilyOptions o;
  o.family = "sd3";
  o.init_seed = 7;
  auto family = create_family(o);
  const std::vector<WrapUnit> units = family->wrap_units();
  REQUIRE(units.size() == 4);
  CHECK(units[3].name == "transformer_blocks.3");
  const auto params = family->named_parameters();
  for (const auto& p : units[2].module->named_parameters()) CHECK(params.contains("transformer_blocks.2." + p.key()));
  const at::Tensor x = at::randn({2, 16, 8, 6});
  const at::Tensor t = at::tensor({3.0f, 917.5f});
  const Cond cond{{{"encoder_hidden_states", at::randn({2, 8, 48})}, {"pooled_projections", at::randn({2, 32})}}};
  torch::NoGradGuard no_grad;
  const at::Tensor direct = family->noise_pred(x, t, t / 1000, cond, {});
  CountingRunner runner(/*repeat=*/true);
  ForwardContext ctx;
  ctx.runner = &runner;
  CHECK(at::equal(direct, family->noise_pred(x, t, t / 1000, cond, ctx)));
  CHECK(runner.order == std::vector<size_t>{0, 1, 2, 3});
  CHECK(direct.sizes() == x.sizes());
  CHECK_THROWS_WITH(family->noise_pred(x.slice(1, 0, 4), t, t, cond, {}), Contains("hidden_states"));
  CHECK_THROWS_WITH(family->noise_pred(x, t, t, Cond{}, {}), Contains("is missing (present: none)"));
  CHECK_THROWS_WITH(family->noise_pred(at::randn({2, 16, 26, 6}), t, t, cond, {}),
                    Contains("exceeds pos_embed_max_size 12"));
}

TEST_CASE("sd3: gradients reach every parameter", "[models][sd3]") {
  FamilyOptions o;
  o.family = "sd3";
  o.init_seed = 3;
  auto family = create_family(o);
  const Cond cond{{{"encoder_hidden_states", at::randn({1, 8, 48})}, {"pooled_projections", at::randn({1, 32})}}};
  const at::Tensor t = at::tensor({500.0f});
  family->noise_pred(at::randn({1, 16, 8, 8}), t, t / 1000, cond, {}).square().mean().backward();
  // The last block is context_pre_only: its text-stream outputs are dropped,
  // so the text queries get an exact zero gradient (keys and values still
  // feed the image tokens).
  const std::set<std::string> dead = {"transformer_blocks.3.attn.add_q_proj.weight",
                                      "transformer_blocks.3.attn.add_q_proj.bias",
                                      "transformer_blocks.3.attn.norm_added_q.weight"};
  for (const auto& p : family->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(at::isfinite(p.value().grad()).all().item<bool>());
    CHECK((p.value().grad().abs().sum().item<double>() > 0) == !dead.count(p.key()));
  }
}

TEST_CASE("families: registry / conditioning lookup and CFG combine", "[models][family]") {
  CHECK(family_names() == std::vector<std::string>{"flux", "flux2", "ltx", "qwen_image", "sd3", "wan"});
  FamilyOptions o;
  o.family = "sdxl";
  CHECK_THROWS_WITH(create_family(o), Contains("unknown model family 'sdxl'") && Contains("sd3"));
  o.family = "sd3";
  o.attention = AttentionBackend::Cudnn;
  if (!ditrl::kCudaBuild) CHECK_THROWS_WITH(create_family(o), Contains("runs on CUDA only"));
  o.attention = AttentionBackend::Math;
  auto family = create_family(o);
  const at::Tensor pos = at::full({2}, 3.0), neg = at::full({2}, 1.0);
  GuidanceOptions g;
  g.scale = 4.5;
  CHECK(at::allclose(family->cfg_combine(pos, neg, g, 500.0), at::full({2}, 1.0 + 4.5 * 2.0)));
  CHECK(family->supports_cfg());
  CHECK(family->latent_shape(3, LatentGrid{1, 16, 12}) == std::vector<int64_t>{3, 16, 16, 12});
  const auto spec = family->cond_spec();
  REQUIRE(spec.size() == 2);
  CHECK(spec[0].name == "encoder_hidden_states");
  CHECK(spec[0].shape == std::vector<int64_t>{8, 48});
  CHECK(spec[1].shape == std::vector<int64_t>{32});
}
