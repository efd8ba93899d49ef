#include <ditrl/error.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/packed_latents.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <array>
#include <cmath>
#include <set>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;
using test::max_abs_diff;

namespace {

Cond qwen_cond(const ReferenceCase& c) {
  return Cond{{{"encoder_hidden_states", c.inputs.at("encoder_hidden_states")},
               {"encoder_hidden_states_mask", c.inputs.at("encoder_hidden_states_mask")}}};
}

}  // namespace

TEST_CASE("qwen_image: the preset has the released parameter count / built on the meta device",
          "[models][qwen_image]") {
  FamilyOptions o;
  o.family = "qwen_image";
  o.preset = "qwen-image";
  o.device = c10::kMeta;
  auto family = create_family(o);
  for (const auto& p : family->parameters()) CHECK(p.is_meta());
  CHECK(test::parameter_count(family->parameters()) == 20430401088);  // docs/families.md §4.2
  const auto units = family->wrap_units();
  REQUIRE(units.size() == 60);
  CHECK(test::parameter_count(units[17].module->parameters()) == 339831296);
  const auto names = family->named_parameters();
  CHECK(names["transformer_blocks.59.attn.to_add_out.weight"].sizes() == at::IntArrayRef{3072, 3072});
  CHECK(names["transformer_blocks.0.img_mod.1.weight"].sizes() == at::IntArrayRef{6 * 3072, 3072});
  CHECK(names["txt_norm.weight"].sizes() == at::IntArrayRef{3584});
  CHECK(names["transformer_blocks.3.attn.norm_added_k.weight"].sizes() == at::IntArrayRef{128});
  CHECK(family->named_buffers().size() == 0);  // the RoPE tables are not in the checkpoint
  CHECK_THROWS_WITH(create_family((o.preset = "qwen-image-2", o)),
                    Contains("unknown qwen_image preset 'qwen-image-2'") && Contains("qwen-image"));
}

TEST_CASE("qwen_image: config.json loading and its errors", "[models][qwen_image]") {
  const QwenImageConfig c = QwenImageConfig::from_json(
      R"({"_class_name": "QwenImageTransformer2DModel", "attention_head_dim": 32, "axes_dims_rope": [8, 12, 12],
      "guidance_embeds": false, "in_channels": 16, "joint_attention_dim": 48, "num_attention_heads": 2,
      "num_layers": 2, "out_channels": null, "patch_size": 2})",
      "config.json");
  CHECK(c.out_channels == 16);  // `out_channels or in_channels`
  CHECK(c.axes_dims_rope == std::vector<int64_t>{8, 12, 12});
  const auto error = [](const std::string& text) -> std::string {
    try {
      QwenImageConfig::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error(R"({"num_layerz": 2})"),
             Contains("bad/config.json") && Contains("unknown") && Contains("num_layerz"));
  CHECK_THAT(error(R"({"guidance_embeds": true})"), Contains("guidance_embeds") && Contains("variant"));
  CHECK_THAT(error(R"({"zero_cond_t": true})"), Contains("zero_cond_t"));
  CHECK_THAT(error(R"({"axes_dims_rope": [16, 56, 58]})"), Contains("must sum to attention_head_dim 128"));
  CHECK_THAT(error(R"({"axes_dims_rope": [16, 112]})"), Contains("3 entries"));
  CHECK_THAT(error(R"({"in_channels": "64"})"), Contains("'in_channels' must be an integer"));
}

TEST_CASE("qwen_image: ditrl forward on the fixture case writes the reference's outputs", "[models][qwen_image][cli]") {
  const std::string config = fixture_path("qwen_image/config.json");
  const std::string out = test::fresh_output_dir("qwen_cli_forward") + "/out.safetensors";
  const auto fwd = test::run_process(fmt::format(
      "{} forward --family qwen_image --config {} --weights {} --inputs {} --out {} --threads 1", DITRL_BINARY, config,
      fixture_path("qwen_image/weights.safetensors"), fixture_path("qwen_image/case_1.safetensors"), out));
  INFO(fwd.output);
  CHECK(fwd.exit_code == 0);
  CHECK(test::fp32_ulps_off(io::SafetensorsFile(out).get("output"),
                            load_reference_case(fixture_path("qwen_image/case_1.safetensors")).stored.at("output")) <=
        test::fixture_fp32_ulps("qwen_image"));
}

TEST_CASE("qwen_image: noise_pred on unpacked latents equals the packed reference forward", "[models][qwen_image]") {
  // Packing layout: feature c*4 + py*2 + px of token row*w + col.
  const at::Tensor latents = at::arange(2 * 3 * 4 * 6, at::kFloat).reshape({2, 3, 4, 6});
  const at::Tensor packed = pack_latents(latents, 2);
  REQUIRE(packed.sizes() == at::IntArrayRef{2, 6, 12});
  const int64_t b = 1, c = 2, row = 1, col = 2, py = 1, px = 0;
  CHECK(packed[b][row * 3 + col][c * 4 + py * 2 + px].item<float>() ==
        latents[b][c][row * 2 + py][col * 2 + px].item<float>());
  CHECK(at::equal(unpack_latents(packed, 4, 6, 2), latents));

  auto family = test::fixture_family("qwen_image");
  const ReferenceCase rc = load_reference_case(fixture_path("qwen_image/case_1.safetensors"));  // h = 6, w = 4 tokens
  const at::Tensor unpacked = unpack_latents(rc.inputs.at("hidden_states"), 12, 8, 2);
  CHECK(family->latent_shape(2, LatentGrid{1, 12, 8}) == unpacked.sizes().vec());
  torch::NoGradGuard no_grad;
  const at::Tensor sigma = rc.inputs.at("timestep");
  const at::Tensor v = family->noise_pred(unpacked, sigma * 1000, sigma, qwen_cond(rc), {});
  CHECK(at::equal(pack_latents(v, 2), run_reference_case(*family, rc, false).at("output")));
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{2, 8, 8}), Contains("frames = 1"));
  CHECK_THROWS_WITH(family->latent_shape(1, LatentGrid{1, 7, 8}), Contains("multiple of patch_size 2"));
}

TEST_CASE("qwen_image: noise_pred reads sigma / never the trajectory timesteps", "[models][qwen_image]") {
  auto family = test::fixture_family("qwen_image");
  CHECK(family->timestep_domain() == TimestepDomain::Sigma);
  const ReferenceCase rc = load_reference_case(fixture_path("qwen_image/case_0.safetensors"));
  const at::Tensor x = unpack_latents(rc.inputs.at("hidden_states"), 8, 12, 2);
  const at::Tensor sigma = rc.inputs.at("timestep");  // 0.6
  torch::NoGradGuard no_grad;
  const at::Tensor v = family->noise_pred(x, sigma * 1000, sigma, qwen_cond(rc), {});
  CHECK(at::equal(v, family->noise_pred(x, at::full({1}, NAN), sigma, qwen_cond(rc), {})));  // t unused
  const at::Tensor sigma_next = at::nextafter(sigma, at::ones({1}));                         // one fp32 ulp of sigma
  CHECK_FALSE(at::equal(v, family->noise_pred(x, sigma * 1000, sigma_next, qwen_cond(rc), {})));
}

TEST_CASE("qwen_image: an all-true text mask never reaches attention - padding does", "[models][qwen_image]") {
  auto family = test::fixture_family("qwen_image");
  torch::NoGradGuard no_grad;
  for (const char* name : {"case_0", "case_1"}) {
    INFO(name);
    const ReferenceCase rc = load_reference_case(fixture_path(std::string("qwen_image/") + name + ".safetensors"));
    const bool padded = !rc.inputs.at("encoder_hidden_states_mask").to(at::kBool).all().item<bool>();
    test::RecordingRunner runner;
    ForwardContext ctx;
    ctx.runner = &runner;
    const at::Tensor out = family->reference_forward(rc.inputs, rc.extra_json, ctx).at("output");
    REQUIRE(runner.inputs.size() == 2);
    const at::Tensor& mask = runner.inputs[0].at(5);
    CHECK(mask.defined() == padded);
    if (padded) {
      const int64_t text = rc.inputs.at("encoder_hidden_states").size(1), image = rc.inputs.at("hidden_states").size(1);
      CHECK(mask.sizes() == at::IntArrayRef{2, 1, 1, text + image});
      CHECK(mask.slice(3, text).all().item<bool>());
    } else {
      auto without = rc.inputs;
      without.erase("encoder_hidden_states_mask");
      CHECK(at::equal(out, family->reference_forward(without, rc.extra_json, {}).at("output")));
    }
  }
  // noise_pred decides from the mask's host copy (what Cond::to keeps), not the device tensor.
  const ReferenceCase rc = load_reference_case(fixture_path("qwen_image/case_1.safetensors"));  // padded
  const at::Tensor x = unpack_latents(rc.inputs.at("hidden_states"), 12, 8, 2);
  const at::Tensor sigma = rc.inputs.at("timestep");
  const at::Tensor& padding = rc.inputs.at("encoder_hidden_states_mask");
  REQUIRE_FALSE(padding.to(at::kBool).all().item<bool>());
  Cond cond = qwen_cond(rc);
  for (const bool padded_on_host : {true, false}) {
    cond.host["encoder_hidden_states_mask"] = padded_on_host ? padding : at::ones_like(padding);
    test::RecordingRunner runner;
    ForwardContext ctx;
    ctx.runner = &runner;
    family->noise_pred(x, sigma * 1000, sigma, cond, ctx);
    REQUIRE(runner.inputs.size() == 2);
    CHECK(runner.inputs[0].at(5).defined() == padded_on_host);
  }
}

TEST_CASE("qwen_image: true CFG rescales to the positive norm over each token's packed channels",
          "[models][qwen_image]") {
  FamilyOptions o;
  o.family = "qwen_image";
  auto family = create_family(o);
  const at::Tensor pos = at::randn({2, 16, 4, 6}, at::kDouble), neg = at::randn({2, 16, 4, 6}, at::kDouble);
  GuidanceOptions g;
  g.scale = 3.0;
  CHECK(family->guidance_scale(g, 500) == 3.0);
  CHECK(at::allclose(family->cfg_combine(pos, neg, g, 500), neg + 3.0 * (pos - neg)));  // no true CFG: plain
  g.true_cfg_scale = 4.0;
  CHECK(family->guidance_scale(g, 500) == 4.0);  // true_cfg_scale wins
  const at::Tensor v = family->cfg_combine(pos, neg, g, 500);
  // Independent check: every 2x2 patch token's 64 values (16 channels x 2 x 2).
  const at::Tensor comb = neg + 4.0 * (pos - neg);
  for (const auto& [row, col] : {std::pair<int64_t, int64_t>{0, 0}, {1, 2}}) {
    const auto patch = [&](const at::Tensor& t) {
      return t[1].slice(1, 2 * row, 2 * row + 2).slice(2, 2 * col, 2 * col + 2);
    };
    const double ratio = patch(pos).norm().item<double>() / patch(comb).norm().item<double>();
    CHECK(at::allclose(patch(v), patch(comb) * ratio, 1e-12, 1e-12));
    CHECK(patch(v).norm().item<double>() == Approx(patch(pos).norm().item<double>()).epsilon(1e-12));
  }
  g.true_cfg_scale = 1.0;
  CHECK_FALSE(uses_cfg(*family, g, 500));
  CHECK(at::allclose(family->cfg_combine(pos, neg, g, 500), pos));
}

TEST_CASE("qwen_image: units run in order / recomputable - gradients reach every live parameter",
          "[models][qwen_image]") {
  FamilyOptions o;
  o.family = "qwen_image";
  o.init_seed = 3;
  auto family = create_family(o);
  const auto spec = family->cond_spec();
  REQUIRE(spec.size() == 2);
  CHECK(spec[1].name == "encoder_hidden_states_mask");
  CHECK(spec[1].dtype == c10::ScalarType::Long);
  CHECK(spec[0].shape == std::vector<int64_t>{8, 32});
  const at::Tensor x = at::randn(family->latent_shape(2, LatentGrid{1, 6, 10}));
  CHECK(x.sizes() == at::IntArrayRef{2, 16, 6, 10});
  const at::Tensor sigma = at::tensor({0.25f, 0.25f});
  const Cond cond{
      {{"encoder_hidden_states", at::randn({2, 8, 32})}, {"encoder_hidden_states_mask", at::ones({2, 8}, at::kLong)}}};
  {
    torch::NoGradGuard no_grad;
    const at::Tensor direct = family->noise_pred(x, sigma * 1000, sigma, cond, {});
    test::RecordingRunner runner(/*repeat=*/true);
    ForwardContext ctx;
    ctx.runner = &runner;
    CHECK(at::equal(direct, family->noise_pred(x, sigma * 1000, sigma, cond, ctx)));
    CHECK(runner.order == std::vector<size_t>{0, 1});
    CHECK(direct.sizes() == x.sizes());
  }
  family->noise_pred(x, sigma * 1000, sigma, cond, {}).square().mean().backward();
  // The last block's text-stream outputs are discarded: its text queries get
  // exact zero gradients, its text output projection and MLP none at all
  // (docs/families.md §4.3).
  const std::set<std::string> dead = {
      "transformer_blocks.1.attn.add_q_proj.weight",   "transformer_blocks.1.attn.add_q_proj.bias",
      "transformer_blocks.1.attn.norm_added_q.weight", "transformer_blocks.1.attn.to_add_out.weight",
      "transformer_blocks.1.attn.to_add_out.bias",     "transformer_blocks.1.txt_mlp.net.0.proj.weight",
      "transformer_blocks.1.txt_mlp.net.0.proj.bias",  "transformer_blocks.1.txt_mlp.net.2.weight",
      "transformer_blocks.1.txt_mlp.net.2.bias"};
  for (const auto& p : family->named_parameters()) {
    INFO(p.key());
    const at::Tensor& grad = p.value().grad();
    CHECK((!grad.defined() || at::isfinite(grad).all().item<bool>()));
    CHECK((grad.defined() && grad.abs().sum().item<double>() > 0) == !dead.count(p.key()));
  }
}

TEST_CASE("families: wan and qwen_image are registered next to sd3", "[models][family]") {
  const auto names = family_names();
  for (const char* name : {"qwen_image", "sd3", "wan"}) CHECK(std::count(names.begin(), names.end(), name) == 1);
}

TEST_CASE("qwen_image: parity dump points record once per forward / in forward order / and change nothing",
          "[models][qwen_image]") {
  auto family = test::fixture_family("qwen_image");
  const ReferenceCase c = load_reference_case(fixture_path("qwen_image/case_1.safetensors"));
  const at::Tensor x = unpack_latents(c.inputs.at("hidden_states"), 2 * 6, 2 * 4, 2);  // img_shapes (1, 6, 4)
  const at::Tensor sigma = c.inputs.at("timestep");
  torch::NoGradGuard no_grad;
  test::ListTap tap;
  test::RecordingRunner runner(/*repeat=*/true);  // a recomputing runner records nothing twice
  ForwardContext ctx;
  ctx.tap = &tap;
  ctx.runner = &runner;
  const at::Tensor v = family->noise_pred(x, sigma * 1000, sigma, qwen_cond(c), ctx);
  CHECK(at::equal(v, family->noise_pred(x, sigma * 1000, sigma, qwen_cond(c), {})));
  // The AdaLN input is the sigma snapshot itself, bit for bit.
  REQUIRE(tap.count("time_text_embed.in0") == 1);
  CHECK(at::equal(tap.tensors.at("time_text_embed.in0"), sigma));
  std::vector<std::string> order = {"time_text_embed.in0"};
  for (int i = 0; i < 2; ++i)
    for (const char* point : {".norm1.out0", ".norm1.out1", ".attn.out0", ".attn.out1", ".out0", ".out1"})
      order.push_back("transformer_blocks." + std::to_string(i) + point);
  order.push_back("proj_out.out0");
  for (size_t k = 0; k < order.size(); ++k) {
    INFO(order[k]);
    CHECK(tap.count(order[k]) == 1);
    if (k > 0) CHECK(tap.position(order[k - 1]) <= tap.position(order[k]));
  }
  const int64_t text = c.inputs.at("encoder_hidden_states").size(1), image = c.inputs.at("hidden_states").size(1);
  CHECK(tap.tensors.at("transformer_blocks.0.attn.out0").sizes() == at::IntArrayRef{2, image, 64});
  CHECK(tap.tensors.at("transformer_blocks.0.attn.out1").sizes() == at::IntArrayRef{2, text, 64});
  CHECK(at::equal(tap.tensors.at("proj_out.out0"), pack_latents(v, 2)));
}

TEST_CASE("qwen_image: MSRoPE tables: centred image rows and columns / text after the image / deterministic",
          "[models][qwen_image]") {
  const std::vector<int64_t> axes = {4, 6, 6};  // pairs: 2 frame | 3 row | 3 column
  const QwenRope rope(axes);
  const int64_t frames = 1, height = 3, width = 4, text = 5;
  const auto [image, txt] = rope.freqs(frames, height, width, text, at::kCPU);
  REQUIRE(image.sizes() == at::IntArrayRef{12, 8});
  REQUIRE(txt.sizes() == at::IntArrayRef{5, 8});
  CHECK(image.scalar_type() == at::kComplexFloat);
  // Pair j of an axis with d dims turns by pos / 10000^(2k/d).
  const auto angle = [&](size_t pair, const std::array<int64_t, 3>& pos) {
    const size_t axis = pair < 2 ? 0 : pair < 5 ? 1 : 2;
    const int64_t k = static_cast<int64_t>(pair) - (axis == 0 ? 0 : axis == 1 ? 2 : 5);
    const double d = static_cast<double>(axes[axis]);
    return static_cast<double>(pos[axis]) / std::pow(10000.0, 2.0 * static_cast<double>(k) / d);
  };
  const auto check = [&](const at::Tensor& table, int64_t token, const std::array<int64_t, 3>& pos) {
    const at::Tensor t = at::view_as_real(table[token]).to(at::kDouble);
    for (size_t j = 0; j < 8; ++j) {
      INFO("token " << token << " pair " << j);
      CHECK(t[static_cast<int64_t>(j)][0].item<double>() == Approx(std::cos(angle(j, pos))).margin(1e-6));
      CHECK(t[static_cast<int64_t>(j)][1].item<double>() == Approx(std::sin(angle(j, pos))).margin(1e-6));
    }
  };
  // Rows -2, -1, 0 (height 3: -ceil(3/2) .. floor(3/2)-1), columns -2 .. 1.
  for (int64_t r = 0; r < height; ++r)
    for (int64_t c = 0; c < width; ++c) check(image, r * width + c, {0, r - 2, c - 2});
  // Text token j sits at max(h/2, w/2) + j = 2 + j on every axis.
  for (int64_t j = 0; j < text; ++j) check(txt, j, {2 + j, 2 + j, 2 + j});
  // Deterministic: an independently built table is bit-identical.
  const auto [image2, txt2] = QwenRope(axes).freqs(frames, height, width, text, at::kCPU);
  CHECK(at::equal(at::view_as_real(image), at::view_as_real(image2)));
  CHECK(at::equal(at::view_as_real(txt), at::view_as_real(txt2)));
  CHECK_THROWS_WITH(rope.freqs(1, 4, 4, 4095, at::kCPU), Contains("positions beyond 4096"));
}

// A rollout runs in inference mode and may be the first to build the tables;
// the training forward then saves them for backward.
TEST_CASE("qwen_image: rope tables first built in inference mode can be saved for backward",
          "[models][qwen_image][rope]") {
  const models::QwenRope rope({4, 6, 6});
  {
    const c10::InferenceMode inference;
    rope.freqs(1, 4, 4, 8, at::kCPU);
  }
  const auto [image, text] = rope.freqs(1, 4, 4, 8, at::kCPU);
  const at::Tensor x = at::randn({1, 16, 2, 16}).requires_grad_();
  const at::Tensor c = at::randn({1, 8, 2, 16}).requires_grad_();
  CHECK_NOTHROW(models::QwenRope::apply(x, image).sum().backward());
  CHECK_NOTHROW(models::QwenRope::apply(c, text).sum().backward());
  CHECK(c.grad().defined());
}
