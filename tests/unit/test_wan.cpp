#include <ditrl/error.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/wan/wan.hpp>
#include <ditrl/models/weights.hpp>

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"
#include "same_bits.hpp"

#include <set>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;
using test::max_abs_diff;

namespace {

Cond wan_cond(const at::Tensor& text) {
  return Cond{{{"encoder_hidden_states", text}}};
}

// The fixture architecture with two experts: expert 0 holds the fixture
// weights, expert 1 the same weights scaled (a different model).
std::shared_ptr<Family> two_fixture_experts() {
  FamilyOptions o;
  o.family = "wan";
  o.config_json = fixture_path("wan/config.json");
  o.experts = 2;
  auto family = create_family(o);
  const io::Checkpoint weights(fixture_path("wan/weights.safetensors"));
  const auto experts = family->expert_modules();
  REQUIRE(experts.size() == 2);
  load_weights(*experts[0], weights);
  load_weights(*experts[1], weights);
  torch::NoGradGuard no_grad;
  for (auto& p : experts[1]->parameters()) p.mul_(0.9);
  return family;
}

}  // namespace

TEST_CASE("wan: presets have the released parameter counts / built on the meta device", "[models][wan]") {
  struct Expected {
    const char* preset;
    int64_t per_expert;
    size_t experts, blocks;
  };
  // docs/families.md §2.2.
  for (const Expected& e :
       {Expected{"wan2.1-t2v-1.3b", 1418996800, 1, 30}, Expected{"wan2.1-t2v-14b", 14288491584, 1, 40},
        Expected{"wan2.2-t2v-a14b", 14288491584, 2, 40}, Expected{"wan2.2-ti2v-5b", 4999787712, 1, 30}}) {
    INFO(e.preset);
    FamilyOptions o;
    o.family = "wan";
    o.preset = e.preset;
    o.device = c10::kMeta;
    auto family = create_family(o);
    for (const auto& p : family->parameters()) CHECK(p.is_meta());
    CHECK(test::parameter_count(family->parameters()) == e.per_expert * static_cast<int64_t>(e.experts));
    CHECK(family->wrap_units().size() == e.blocks * e.experts);
    const auto experts = family->expert_modules();
    CHECK(experts.size() == (e.experts == 2 ? 2u : 0u));
    for (const auto& expert : experts) CHECK(test::parameter_count(expert->parameters()) == e.per_expert);
  }
  FamilyOptions o;
  o.family = "wan";
  o.device = c10::kMeta;
  o.preset = "wan2.2-t2v-a14b";
  auto a14b = create_family(o);
  const auto names = a14b->named_parameters();
  CHECK(names["transformer.blocks.39.attn2.norm_k.weight"].sizes() == at::IntArrayRef{5120});
  CHECK(names["transformer_2.scale_shift_table"].sizes() == at::IntArrayRef{1, 2, 5120});
  CHECK(a14b->wrap_units()[40].name == "transformer_2.blocks.0");
  o.preset = "wan2.2-ti2v-5b";
  CHECK(create_family(o)->named_parameters()["patch_embedding.weight"].sizes() == at::IntArrayRef{3072, 48, 1, 2, 2});
  CHECK_THROWS_WITH(create_family((o.preset = "wan3", o)),
                    Contains("unknown wan preset 'wan3'") && Contains("wan2.2-t2v-a14b"));
}

TEST_CASE("wan: config.json loading and its errors", "[models][wan]") {
  const WanConfig c = WanConfig::from_json(R"({"_class_name": "WanTransformer3DModel", "added_kv_proj_dim": null,
      "attention_head_dim": 32, "cross_attn_norm": false, "eps": 1e-06, "ffn_dim": 96, "freq_dim": 16,
      "image_dim": null, "in_channels": 8, "num_attention_heads": 3, "num_layers": 1, "out_channels": 8,
      "patch_size": [1, 2, 2], "pos_embed_seq_len": null, "qk_norm": "rms_norm_across_heads",
      "rope_max_seq_len": 64, "text_dim": 24})",
                                           "config.json");
  CHECK(c.inner_dim() == 96);
  CHECK_FALSE(c.cross_attn_norm);
  CHECK(c.experts == 1);
  FamilyOptions o;
  o.family = "wan";
  o.device = c10::kMeta;
  o.config_json = fixture_path("wan/config.json");
  CHECK(create_family(o)->named_parameters().size() ==
        io::SafetensorsFile(fixture_path("wan/weights.safetensors")).names().size());
  const auto error = [](const std::string& text) -> std::string {
    try {
      WanConfig::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error(R"({"num_layerz": 2})"),
             Contains("bad/config.json") && Contains("unknown") && Contains("num_layerz"));
  CHECK_THAT(error(R"({"image_dim": 1280})"), Contains("image_dim") && Contains("image-to-video"));
  CHECK_THAT(error(R"({"qk_norm": "rms_norm"})"), Contains("qk_norm"));
  CHECK_THAT(error(R"({"patch_size": [2, 2]})"), Contains("patch_size"));
  CHECK_THAT(error(R"({"cross_attn_norm": 1})"), Contains("'cross_attn_norm' must be true or false"));
  CHECK_THAT(error(R"({"attention_head_dim": 31})"), Contains("must be even"));
  CHECK_THAT(error("["), Contains("not valid JSON"));
}

TEST_CASE("wan: ditrl forward on the fixture case writes the reference's outputs", "[models][wan][cli]") {
  const std::string out = test::fresh_output_dir("wan_cli_forward") + "/out.safetensors";
  const auto result = test::run_process(
      fmt::format("{} forward --family wan --config {} --weights {} --inputs {} --out {} --intermediates --threads 1",
                  DITRL_BINARY, fixture_path("wan/config.json"), fixture_path("wan/weights.safetensors"),
                  fixture_path("wan/case_1.safetensors"), out));
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  const ReferenceCase c = load_reference_case(fixture_path("wan/case_1.safetensors"));
  const io::SafetensorsFile written(out);
  for (const auto& [name, stored] : c.stored) {
    INFO(name);
    CHECK(test::fp32_ulps_off(written.get(name), stored) <= test::fixture_fp32_ulps("wan"));
  }
}

TEST_CASE("wan: noise_pred reads the trajectory timesteps t / never sigma", "[models][wan]") {
  auto family = test::fixture_family("wan");
  CHECK(family->timestep_domain() == TimestepDomain::Timestep);
  const ReferenceCase c = load_reference_case(fixture_path("wan/case_0.safetensors"));
  const at::Tensor x = c.inputs.at("hidden_states");
  const Cond cond = wan_cond(c.inputs.at("encoder_hidden_states"));
  const at::Tensor t = c.inputs.at("timestep");  // 700
  torch::NoGradGuard no_grad;
  const at::Tensor v = family->noise_pred(x, t, t / 1000, cond, {});
  CHECK(at::equal(v, run_reference_case(*family, c, false).at("output")));
  CHECK(at::equal(v, family->noise_pred(x, t, at::full({1}, NAN), cond, {})));  // sigma unused
  const at::Tensor t_next = at::nextafter(t, at::full({1}, 1000.0f));           // one ulp of t
  CHECK_FALSE(at::equal(v, family->noise_pred(x, t_next, t / 1000, cond, {})));
}

TEST_CASE("wan: RoPE tables follow the (f h w) grid with the head-dim split", "[models][wan]") {
  const int64_t dh = 32;  // split 12 (time) | 10 (height) | 10 (width)
  const WanRope rope(dh, 1024);
  const auto [cos, sin] = rope.tables(3, 4, 5, at::kCPU);
  REQUIRE(cos.sizes() == at::IntArrayRef{1, 60, 1, dh});
  const auto angle = [](int64_t pos, int64_t k, int64_t dim) {
    return static_cast<double>(pos) / std::pow(10000.0, 2.0 * static_cast<double>(k) / static_cast<double>(dim));
  };
  const int64_t f = 2, h = 1, w = 3, token = (f * 4 + h) * 5 + w;
  for (int64_t j = 0; j < dh / 2; ++j) {
    INFO(j);
    const auto [pos, k, dim] = j < 6    ? std::tuple<int64_t, int64_t, int64_t>{f, j, 12}
                               : j < 11 ? std::tuple<int64_t, int64_t, int64_t>{h, j - 6, 10}
                                        : std::tuple<int64_t, int64_t, int64_t>{w, j - 11, 10};
    CHECK(cos[0][token][0][2 * j].item<float>() == static_cast<float>(std::cos(angle(pos, k, dim))));
    CHECK(cos[0][token][0][2 * j + 1].item<float>() == cos[0][token][0][2 * j].item<float>());  // interleaved pairs
    CHECK(sin[0][token][0][2 * j + 1].item<float>() == static_cast<float>(std::sin(angle(pos, k, dim))));
  }
  // Rotating interleaved pairs by the angle table, against the 2x2 rotation.
  const at::Tensor x = at::randn({1, 60, 2, dh});
  const at::Tensor y = WanRope::apply(x, cos, sin);
  const double c = cos[0][7][0][4].item<double>(), s = sin[0][7][0][5].item<double>();
  CHECK(y[0][7][1][4].item<double>() ==
        Approx(x[0][7][1][4].item<double>() * c - x[0][7][1][5].item<double>() * s).epsilon(1e-6));
  CHECK(y[0][7][1][5].item<double>() ==
        Approx(x[0][7][1][4].item<double>() * s + x[0][7][1][5].item<double>() * c).epsilon(1e-6));
  CHECK_THROWS_WITH(rope.tables(1, 1025, 1, at::kCPU), Contains("rope_max_seq_len is 1024"));
  // Deterministic: an independently built table is bit-identical.
  const auto [cos2, sin2] = WanRope(dh, 1024).tables(3, 4, 5, at::kCPU);
  CHECK(at::equal(cos, cos2));
  CHECK(at::equal(sin, sin2));
}

TEST_CASE("wan: two experts route by t >= 875 and take their own guidance scale", "[models][wan]") {
  auto family = two_fixture_experts();
  auto& wan = dynamic_cast<Wan&>(*family);
  auto single = test::fixture_family("wan");
  const ReferenceCase c = load_reference_case(fixture_path("wan/case_0.safetensors"));
  const at::Tensor x = c.inputs.at("hidden_states");
  const Cond cond = wan_cond(c.inputs.at("encoder_hidden_states"));
  torch::NoGradGuard no_grad;
  CHECK(wan.expert_for(875.0) == 0);
  CHECK(wan.expert_for(874.9999) == 1);
  // High noise: expert 0 (`transformer`, the fixture weights); low noise: expert 1.
  test::RecordingRunner runner;
  ForwardContext ctx;
  ctx.runner = &runner;
  const at::Tensor high = at::tensor({900.0f});
  CHECK(at::equal(family->noise_pred(x, high, high / 1000, cond, ctx),
                  single->noise_pred(x, high, high / 1000, cond, {})));
  CHECK(runner.order == std::vector<size_t>{0, 1});
  runner.order.clear();
  const at::Tensor low = c.inputs.at("timestep");  // 700
  const at::Tensor v_low = family->noise_pred(x, low, low / 1000, cond, ctx);
  CHECK(runner.order == std::vector<size_t>{2, 3});
  CHECK_FALSE(at::equal(v_low, single->noise_pred(x, low, low / 1000, cond, {})));
  CHECK(
      at::equal(v_low, wan.expert(1).forward(x, low, cond.at("encoder_hidden_states"), WanRope(32, 1024), {}, 2, "")));
  // Taps carry the expert prefix (a case without stored intermediates keeps every record).
  ReferenceCase bare = c;
  for (auto it = bare.stored.begin(); it != bare.stored.end();)
    it = it->first.rfind("intermediate.", 0) == 0 ? bare.stored.erase(it) : std::next(it);
  const auto taps = run_reference_case(*family, bare, true);
  CHECK(taps.count("intermediate.transformer_2.blocks.1.out0"));
  CHECK_FALSE(taps.count("intermediate.transformer.blocks.1.out0"));
  // One expert per forward.
  const Cond pair = wan_cond(at::cat({cond.at("encoder_hidden_states"), cond.at("encoder_hidden_states")}));
  CHECK_THROWS_WITH(
      family->noise_pred(at::cat({x, x}), at::tensor({900.0f, 700.0f}), at::tensor({0.9f, 0.7f}), pair, {}),
      Contains("both sides of the expert boundary t = 875"));
  // The caller's host copy of the timesteps routes (the forward reads no device value for it).
  ForwardContext on_host = ctx;
  on_host.host_timesteps = high;
  runner.order.clear();
  CHECK(at::equal(family->noise_pred(x, low, low / 1000, cond, on_host),
                  wan.expert(0).forward(x, low, cond.at("encoder_hidden_states"), WanRope(32, 1024), {}, 0, "")));
  CHECK(runner.order == std::vector<size_t>{0, 1});
  on_host.host_timesteps = at::tensor({900.0f, 700.0f});
  CHECK_THROWS_WITH(
      family->noise_pred(at::cat({x, x}), at::tensor({900.0f, 900.0f}), at::tensor({0.9f, 0.9f}), pair, on_host),
      Contains("both sides of the expert boundary t = 875"));

  GuidanceOptions g;
  g.scale = 4.0;
  g.scale_2 = 3.0;
  CHECK(family->guidance_scale(g, 875.0) == 4.0);
  CHECK(family->guidance_scale(g, 874.0) == 3.0);
  const at::Tensor pos = at::full({2}, 3.0), neg = at::full({2}, 1.0);
  CHECK(at::equal(family->cfg_combine(pos, neg, g, 900.0), at::full({2}, 1.0 + 4.0 * 2.0)));
  CHECK(at::equal(family->cfg_combine(pos, neg, g, 100.0), at::full({2}, 1.0 + 3.0 * 2.0)));
  g.scale_2.reset();
  CHECK(family->guidance_scale(g, 900.0) == 4.0);
  CHECK_THROWS_WITH(family->guidance_scale(g, 500.0), Contains("guidance_scale_2"));
  g.scale_2 = 1.0;
  CHECK(uses_cfg(*family, g, 900.0));
  CHECK_FALSE(uses_cfg(*family, g, 500.0));  // scale_2 = 1: the low-noise phase runs unguided
  CHECK(single->guidance_scale(GuidanceOptions{5.0, {}, {}}, 100.0) == 5.0);
  CHECK_THROWS_WITH(single->guidance_scale(g, 100.0), Contains("has one expert"));
}

TEST_CASE("wan: the two experts load their diffusers folders' checkpoints", "[models][wan]") {
  FamilyOptions o;
  o.family = "wan";
  o.config_json = fixture_path("wan/config.json");
  o.experts = 2;
  auto family = create_family(o);
  const io::Checkpoint weights(fixture_path("wan/weights.safetensors"));
  // The whole two-expert family does not take one expert's names ...
  CHECK_THROWS_WITH(load_weights(*family, weights),
                    Contains("missing") && Contains("transformer.blocks.0.attn1.to_q.weight"));
  // ... each expert module does, without a prefix.
  const auto experts = family->expert_modules();
  load_weights(*experts[1], weights);
  const auto params = family->named_parameters();
  CHECK(at::equal(params["transformer_2.blocks.1.ffn.net.2.weight"], weights.view("blocks.1.ffn.net.2.weight")));
  CHECK(family->default_overrides().size() == 3);
  cast_parameters(*family, at::kBFloat16, family->default_overrides());
  CHECK(params["transformer_2.condition_embedder.time_embedder.linear_2.weight"].scalar_type() == at::kFloat);
  CHECK(params["transformer.scale_shift_table"].scalar_type() == at::kFloat);
  CHECK(params["transformer.blocks.0.norm2.bias"].scalar_type() == at::kFloat);
  CHECK(params["transformer.blocks.0.attn2.norm_k.weight"].scalar_type() == at::kBFloat16);
  o.family = "sd3";
  o.config_json.clear();
  CHECK_THROWS_WITH(create_family(o), Contains("does not run 2 expert DiTs"));
}

TEST_CASE("wan: every block runs through the unit runner / recomputable / and gradients reach every parameter",
          "[models][wan]") {
  FamilyOptions o;
  o.family = "wan";
  o.init_seed = 7;
  auto family = create_family(o);
  const auto shape = family->latent_shape(2, LatentGrid{2, 4, 6});
  CHECK(shape == std::vector<int64_t>{2, 16, 2, 4, 6});
  const at::Tensor x = at::randn(shape);
  const at::Tensor t = at::tensor({300.0f, 300.0f});
  const auto spec = family->cond_spec();
  REQUIRE(spec.size() == 1);
  CHECK(spec[0].shape == std::vector<int64_t>{8, 32});
  const Cond cond = wan_cond(at::randn({2, 8, 32}));
  at::Tensor direct;
  {
    torch::NoGradGuard no_grad;
    direct = family->noise_pred(x, t, t / 1000, cond, {});
    test::RecordingRunner runner(/*repeat=*/true);
    ForwardContext ctx;
    ctx.runner = &runner;
    CHECK(at::equal(direct, family->noise_pred(x, t, t / 1000, cond, ctx)));
    CHECK(runner.order == std::vector<size_t>{0, 1});
  }
  CHECK(direct.sizes() == x.sizes());
  family->noise_pred(x, t, t / 1000, cond, {}).square().mean().backward();
  for (const auto& p : family->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(p.value().grad().abs().sum().item<double>() > 0);
  }
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{1, 5, 4}),
                    Contains("height 5 is not a multiple of patch_size 2"));
  CHECK_THROWS_WITH(family->noise_pred(x, t, t, Cond{}, {}), Contains("is missing (present: none)"));
  CHECK_THROWS_WITH(family->noise_pred(x, t, t, wan_cond(at::randn({2, 8, 31})), {}),
                    Contains("encoder_hidden_states"));
}

TEST_CASE("wan: parity dump points record once per forward / in forward order / and change nothing", "[models][wan]") {
  auto family = test::fixture_family("wan");
  const ReferenceCase c = load_reference_case(fixture_path("wan/case_0.safetensors"));
  const at::Tensor x = c.inputs.at("hidden_states");
  const at::Tensor t = c.inputs.at("timestep");
  const Cond cond = wan_cond(c.inputs.at("encoder_hidden_states"));
  torch::NoGradGuard no_grad;
  test::ListTap tap;
  test::RecordingRunner runner(/*repeat=*/true);  // a recomputing runner records nothing twice
  ForwardContext ctx;
  ctx.tap = &tap;
  ctx.runner = &runner;
  const at::Tensor v = family->noise_pred(x, t, t / 1000, cond, ctx);
  CHECK(at::equal(v, family->noise_pred(x, t, t / 1000, cond, {})));
  // The AdaLN input is the trajectory timestep itself, bit for bit.
  REQUIRE(tap.count("condition_embedder.in0") == 1);
  CHECK(at::equal(tap.tensors.at("condition_embedder.in0"), t));
  std::vector<std::string> order = {"condition_embedder.in0"};
  for (int i = 0; i < 2; ++i)
    for (const char* point : {".norm1.out0", ".attn1.out0", ".attn2.out0", ".out0"})
      order.push_back("blocks." + std::to_string(i) + point);
  order.push_back("proj_out.out0");
  for (size_t k = 0; k < order.size(); ++k) {
    INFO(order[k]);
    CHECK(tap.count(order[k]) == 1);
    if (k > 0) CHECK(tap.position(order[k - 1]) < tap.position(order[k]));
  }
  CHECK(tap.tensors.at("blocks.1.norm1.out0").sizes() == at::IntArrayRef{1, 18, 64});
  CHECK(tap.tensors.at("blocks.1.attn2.out0").sizes() == at::IntArrayRef{1, 18, 64});
  CHECK(at::equal(tap.tensors.at("proj_out.out0"),
                  run_reference_case(*family, c, true).at("intermediate.proj_out.out0")));
}

TEST_CASE("wan: the guided velocity runs each phase's expert with that phase's guidance scale", "[models][wan]") {
  auto family = two_fixture_experts();
  const ReferenceCase c = load_reference_case(fixture_path("wan/case_0.safetensors"));
  const at::Tensor x = c.inputs.at("hidden_states");
  const Cond pos = wan_cond(c.inputs.at("encoder_hidden_states"));
  at::manual_seed(3);
  const Cond neg = wan_cond(at::randn_like(c.inputs.at("encoder_hidden_states")));
  GuidanceOptions g;
  g.scale = 4.0;    // high-noise expert `transformer`
  g.scale_2 = 3.0;  // low-noise expert `transformer_2`
  torch::NoGradGuard no_grad;
  for (const auto& [t_value, scale, expert_units] :
       {std::tuple<float, double, std::vector<size_t>>{900.0f, 4.0, {0, 1}}, {700.0f, 3.0, {2, 3}}}) {
    INFO("t = " << t_value);
    const at::Tensor t = at::full({1}, t_value), sigma = t / 1000;
    test::RecordingRunner runner;
    ForwardContext ctx;
    ctx.runner = &runner;
    const at::Tensor v = guided_velocity(*family, {x, t, sigma, &pos, &neg, t_value}, g, ctx);
    CHECK(runner.order == expert_units);  // one joint [pos; neg] forward on the phase's expert
    const at::Tensor vp = family->noise_pred(x, t, sigma, pos, {}), vn = family->noise_pred(x, t, sigma, neg, {});
    CHECK(max_abs_diff(v, vn + scale * (vp - vn)) <= 1e-5);
  }
}

// A rollout runs in inference mode and may be the first to build the tables;
// the training forward then saves them for backward.
TEST_CASE("wan: rope tables first built in inference mode can be saved for backward", "[models][wan][rope]") {
  const models::WanRope rope(32, 64);
  {
    const c10::InferenceMode inference;
    rope.tables(1, 4, 4, at::kCPU);
  }
  const auto [cos, sin] = rope.tables(1, 4, 4, at::kCPU);
  const at::Tensor x = at::randn({1, 16, 2, 32}).requires_grad_();
  CHECK_NOTHROW(models::WanRope::apply(x, cos, sin).sum().backward());
  CHECK(x.grad().defined());
}

namespace {

// The op-by-op formula under autograd: what WanRope::apply's written-out
// backward must reproduce bit for bit.
at::Tensor rotate_by_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor pairs = x.unflatten(-1, {-1, 2});
  const at::Tensor x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
  const int64_t n = x.size(-1);
  const at::Tensor c = cos.slice(-1, 0, n, 2), s = sin.slice(-1, 1, n, 2);
  at::Tensor out = at::empty_like(x);
  out.slice(-1, 0, n, 2).copy_(x1 * c - x2 * s);
  out.slice(-1, 1, n, 2).copy_(x1 * s + x2 * c);
  return out;
}

}  // namespace

TEST_CASE("wan: rope's backward equals autograd's on the op-by-op formula bit for bit", "[models][wan][rope]") {
  const models::WanRope rope(32, 64);
  const auto [cos, sin] = rope.tables(2, 4, 4, at::kCPU);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(7);
    // (B, H, L, Dh) transposed to (B, L, H, Dh), as the attention passes q and k.
    const at::Tensor base = at::randn({2, 3, 32, 32}).to(dtype);
    at::Tensor grad = at::randn({2, 32, 3, 32}).to(dtype);
    grad.select(1, 5).zero_();
    grad.select(1, 6).fill_(-0.0);
    const at::Tensor x = base.clone().requires_grad_(), x_ref = base.clone().requires_grad_();
    const at::Tensor y = models::WanRope::apply(x.transpose(1, 2), cos, sin);
    const at::Tensor y_ref = rotate_by_autograd(x_ref.transpose(1, 2), cos, sin);
    CHECK(test::same_bits(y, y_ref));
    y.backward(grad);
    y_ref.backward(grad);
    CHECK(test::same_bits(x.grad(), x_ref.grad()));
    CHECK(x.grad().abs().sum().item<double>() > 0);
    // A gradient arriving in another layout (Ulysses' exchange hands back a
    // contiguous one, the attention a transposed view) gives the same bits in
    // the same layout, so the kernels downstream do not change with it.
    const at::Tensor xt = base.clone().requires_grad_(true).transpose(1, 2);
    const at::Tensor yt = models::WanRope::apply(xt, cos, sin);
    const at::Tensor strided = grad.transpose(1, 2).contiguous().transpose(1, 2);
    const at::Tensor dx = torch::autograd::grad({yt}, {xt}, {grad}, true)[0];
    const at::Tensor dx_strided = torch::autograd::grad({yt}, {xt}, {strided})[0];
    CHECK(test::same_bits(dx, dx_strided));
    CHECK(dx.is_contiguous());
    CHECK(dx_strided.is_contiguous());
  }
}
