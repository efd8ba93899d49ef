#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>

#include <torch/csrc/autograd/grad_mode.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;
using test::max_abs_diff;

namespace {

LtxConfig fixture_config(const std::string& family) {
  std::ifstream in(fixture_path(family + "/config.json"));
  std::ostringstream text;
  text << in.rdbuf();
  return LtxConfig::from_json(text.str(), family + "/config.json");
}

// The fixture model built from an edited config, weights loaded.
std::shared_ptr<LTX> fixture_model(const std::string& family, const LtxConfig& config, FamilyOptions options = {}) {
  options.family = "ltx";
  auto model = std::make_shared<LTX>(config, options);
  load_weights(*model, io::Checkpoint(fixture_path(family + "/weights.safetensors")));
  return model;
}

class CountingRunner : public UnitRunner {
 public:
  Tensors run(size_t index, const Tensors& inputs, const UnitFn& fn) override {
    order.push_back(index);
    {
      TapSuppressGuard quiet;  // a recomputing runner calls the unit again
      (void)fn(inputs);
    }
    return fn(inputs);
  }
  std::vector<size_t> order;
};

std::set<std::string> intermediates(const std::map<std::string, at::Tensor>& tensors) {
  std::set<std::string> out;
  for (const auto& [key, value] : tensors)
    if (key.rfind("intermediate.", 0) == 0) out.insert(key);
  return out;
}

// Parity dump points the tap records besides the fixture's forward-hook
// outputs: the AdaLN inputs, the modulated self-attention inputs, every
// attention's output, the final projections.
bool is_dump_point(const std::string& key) {
  static const std::regex dump(
      R"(intermediate\.(.+\.in0|transformer_blocks\.\d+\.(audio_)?(norm1|attn1|attn2)\.out0|)"
      R"(transformer_blocks\.\d+\.(audio_to_video|video_to_audio)_attn\.out0|(audio_)?proj_out\.out0))");
  return std::regex_match(key, dump);
}

// Keeps every tap record, in call order, as "<module>.<name>".
class ListTap : public Tap {
 public:
  void record(const std::string& module, const std::string& name, const at::Tensor& value) override {
    keys.push_back(module + "." + name);
    tensors[keys.back()] = value.detach().clone();
  }
  size_t count(const std::string& key) const { return static_cast<size_t>(std::count(keys.begin(), keys.end(), key)); }
  std::vector<std::string> keys;
  std::map<std::string, at::Tensor> tensors;
};

// fp32 parity of every case of a fixture family: every output and stored
// intermediate within fixture_fp32_ulps, nothing recorded but the stored
// intermediates and parity dump points.
void check_fp32_cases(const std::string& family, const std::vector<std::string>& cases) {
  auto model = fixture_model(family, fixture_config(family));
  for (const std::string& name : cases) {
    INFO(family << "/" << name);
    const ReferenceCase c = load_reference_case(fixture_path(family + "/" + name + ".safetensors"));
    const auto out = run_reference_case(*model, c, /*intermediates=*/true);
    CHECK(out.count("output.audio") == c.stored.count("output.audio"));
    const std::set<std::string> expected = intermediates(c.stored);
    for (const std::string& key : intermediates(out)) {
      INFO(key);
      CHECK((expected.count(key) == 1 || is_dump_point(key)));
    }
    test::check_fp32_tensors(family + "/" + name, out, c.stored, test::fixture_fp32_ulps(family));
  }
}

Cond context_of(const at::Tensor& context) {
  return Cond{{{"video.context", context}}};
}

}  // namespace

TEST_CASE("ltx: fp32 fixture cases (A+V and video only) and their intermediates match ltx_core", "[models][ltx]") {
  check_fp32_cases("ltx", {"case_0", "case_1", "case_2"});
}

TEST_CASE("ltx: LTX-2 (19B-style) fixture cases match ltx_core", "[models][ltx]") {
  check_fp32_cases("ltx_2_0", {"case_0", "case_1"});
}

TEST_CASE("ltx: parity dump points (AdaLN sigma input / modulation / attention outputs / proj_out)", "[models][ltx]") {
  auto model = fixture_model("ltx", fixture_config("ltx"));
  torch::NoGradGuard no_grad;
  for (const std::string name : {"case_0", "case_2"}) {
    INFO(name);
    const ReferenceCase c = load_reference_case(fixture_path("ltx/" + name + ".safetensors"));
    const bool audio = c.inputs.count("audio.latent") == 1;
    ListTap tap;
    ForwardContext ctx;
    ctx.tap = &tap;
    const auto out = model->reference_forward(c.inputs, c.extra_json, ctx);
    // The sigma the AdaLNs consume: per-token sigma x mask x 1000, and sigma x 1000 for the prompt AdaLN.
    CHECK(at::equal(tap.tensors.at("adaln_single.in0"), (c.inputs.at("video.timesteps") * 1000).flatten()));
    CHECK(at::equal(tap.tensors.at("prompt_adaln_single.in0"), c.inputs.at("video.sigma") * 1000));
    CHECK(at::equal(tap.tensors.at("proj_out.out0"), out.at("output.video")));
    CHECK(tap.count("audio_proj_out.out0") == (audio ? 1u : 0u));
    if (audio) {
      CHECK(at::equal(tap.tensors.at("audio_proj_out.out0"), out.at("output.audio")));
      // The A/V gate of each stream follows the other stream's sigma.
      CHECK(at::equal(tap.tensors.at("av_ca_a2v_gate_adaln_single.in0"), c.inputs.at("audio.sigma") * 1000));
      CHECK(at::equal(tap.tensors.at("av_ca_v2a_gate_adaln_single.in0"), c.inputs.at("video.sigma") * 1000));
    }
    std::vector<std::string> subs = {"norm1", "attn1", "attn2"};
    if (audio)
      subs.insert(subs.end(),
                  {"audio_norm1", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"});
    for (size_t i = 0; i < model->blocks.size(); ++i) {
      const std::string block = "transformer_blocks." + std::to_string(i);
      for (const std::string& sub : subs) {
        INFO(block << "." << sub);
        CHECK(tap.count(block + "." + sub + ".out0") == 1);
      }
    }
    // The recorded self-attention output is attn1 of the recorded modulated input.
    const at::Tensor norm1 = tap.tensors.at("transformer_blocks.1.norm1.out0");
    const at::Tensor latent = c.inputs.at("video.latent");
    CHECK(norm1.sizes() == at::IntArrayRef{latent.size(0), latent.size(1), model->config().inner_dim()});
    RopeOptions rope;
    rope.inner_dim = model->config().inner_dim();
    rope.heads = model->config().num_attention_heads;
    rope.max_pos = model->config().positional_embedding_max_pos;
    const RopeTables pe = ltx_rope_tables(c.inputs.at("video.positions"), rope, at::kFloat);
    const at::Tensor attn1 = model->blocks[1]->attn1->forward(norm1, norm1, {}, &pe, nullptr);
    CHECK(max_abs_diff(attn1, tap.tensors.at("transformer_blocks.1.attn1.out0")) == 0);
  }
  // noise_pred through a recomputing runner records each point once; no tap, no records.
  FamilyOptions o;
  o.latent_grid = {2, 2, 3, 24.0};
  auto family = test::fixture_family("ltx", o);
  const ReferenceCase c = load_reference_case(fixture_path("ltx/case_2.safetensors"));
  ListTap tap;
  CountingRunner runner;
  ForwardContext ctx;
  ctx.tap = &tap;
  ctx.runner = &runner;
  const at::Tensor sigma = c.inputs.at("video.sigma");
  const at::Tensor v = family->noise_pred(c.inputs.at("video.latent"), sigma * 1000, sigma,
                                          context_of(c.inputs.at("video.context")), ctx);
  for (const std::string& key : tap.keys) {
    INFO(key);
    CHECK(tap.count(key) == 1);
  }
  CHECK(tap.count("transformer_blocks.1.attn2.out0") == 1);
  CHECK(at::equal(tap.tensors.at("prompt_adaln_single.in0"), sigma * 1000));
  CHECK(at::equal(v, family->noise_pred(c.inputs.at("video.latent"), sigma * 1000, sigma,
                                        context_of(c.inputs.at("video.context")), {})));
}

TEST_CASE("ltx: bf16 fixture cases / output tail rounding points", "[models][ltx]") {
  for (const std::string family : {"ltx", "ltx_2_0"}) {
    INFO(family);
    const auto sidecar = test::read_json(fixture_path(family + "/case_bf16.json"));
    const ReferenceCase c = load_reference_case(fixture_path(family + "/case_bf16.safetensors"));
    std::map<bool, std::map<std::string, at::Tensor>> outputs;
    for (const bool fp32_tail : {false, true}) {
      LtxConfig config = fixture_config(family);
      config.fp32_output_tail = fp32_tail;
      auto model = fixture_model(family, config);
      cast_parameters(*model, at::kBFloat16, model->default_overrides());
      for (const auto& p : model->named_parameters()) {
        INFO(p.key());
        CHECK(p.value().scalar_type() == at::kBFloat16);
        CHECK(sidecar.at("weights_dtype_map").at("model.diffusion_model." + p.key()).as_string() == "bfloat16");
      }
      outputs[fp32_tail] = run_reference_case(*model, c, false);
    }
    for (const std::string output : {"output.video", "output.audio"}) {
      INFO(output);
      const at::Tensor ref = c.stored.at(output);
      const at::Tensor eager = outputs[false].at(output);
      const at::Tensor tail = outputs[true].at(output);
      CHECK(eager.scalar_type() == at::kBFloat16);
      const double eager_err = max_abs_diff(eager, ref);
      const double tail_err = max_abs_diff(tail, ref);
      const double absmax = ref.abs().max().item<double>();
      WARN(family << " bf16 " << output << ": max |ditrl - reference| = " << eager_err
                  << " with ltx_core's eager bf16 output tail, " << tail_err << " with the fp32 tail (|output| max "
                  << absmax << ")");
      // ltx_core's fixture forward runs every op in bf16 and this port
      // reproduces its rounding points op for op: bit for bit.
      test::check_bf16_output(family + " " + output, eager, ref);
      // The fp32 tail rounds once instead of after the LayerNorm, the product
      // and the sum: a few bf16 ulps of the output, never more.
      CHECK(tail_err <= 4.0 / 16);
    }
  }
}

TEST_CASE("ltx: RoPE frequency grid / pixel coordinates and table layout", "[models][ltx]") {
  // numpy's float64 recipe rounded to fp32 (values from ltx_core's
  // generate_freq_grid_np on CPU): entries and the sequential float64 sum.
  struct Grid {
    int64_t axes, inner;
    std::vector<std::pair<int64_t, float>> entries;
    double sum;
  };
  for (const Grid& g :
       {Grid{3,
             4096,
             {{0, 0x1.921fb6p+0f}, {1, 0x1.979974p+0f}, {341, 0x1.3c4a7ap+7f}, {681, 0x1.eadfb4p+13f}},
             1169181.6957039833},
        Grid{1, 2048, {{1, 0x1.95c2b8p+0f}, {512, 0x1.3b93a2p+7f}, {1022, 0x1.e67966p+13f}}, 1752388.339159727},
        Grid{3, 64, {{1, 0x1.17bbbep+2f}, {5, 0x1.06064ep+8f}, {9, 0x1.eadfb4p+13f}}, 24519.10974776745}}) {
    INFO(g.axes << " axes, width " << g.inner);
    const at::Tensor grid = ltx_frequency_grid(10000.0, g.axes, g.inner, true);
    REQUIRE(grid.numel() == g.inner / (2 * g.axes));
    for (const auto& [i, v] : g.entries) CHECK(grid[i].item<float>() == v);
    double sum = 0;
    for (int64_t i = 0; i < grid.numel(); ++i) sum += grid[i].item<float>();
    CHECK(sum == g.sum);
  }
  CHECK_THROWS_WITH(ltx_frequency_grid(10000.0, 3, 4, true), Contains("too small"));

  // The fixtures' positions come from ltx_core's patchifier + get_pixel_coords.
  for (const std::string name : {"case_0", "case_1", "case_2"}) {
    INFO(name);
    const ReferenceCase c = load_reference_case(fixture_path("ltx/" + name + ".safetensors"));
    const boost::json::value shape =
        test::read_json(fixture_path("ltx/" + name + ".json")).at("extra").at("video_latent_shape_fhw");
    const at::Tensor stored = c.inputs.at("video.positions");
    const at::Tensor built =
        ltx_video_positions(stored.size(0), shape.at(0).to_number<int64_t>(), shape.at(1).to_number<int64_t>(),
                            shape.at(2).to_number<int64_t>(), 24.0, at::kCPU);
    CHECK(at::equal(built, stored));
  }
  const at::Tensor p = ltx_video_positions(1, 3, 1, 2, 25.0, at::kCPU);
  // frame 0 covers pixel frame [0, 1), frame k [8k - 7, 8k + 1), in seconds
  CHECK(at::equal(p[0][0].select(-1, 0), at::tensor({0.0f, 0.0f, 1 / 25.0f, 1 / 25.0f, 9 / 25.0f, 9 / 25.0f})));
  CHECK(at::equal(p[0][0].select(-1, 1),
                  at::tensor({1 / 25.0f, 1 / 25.0f, 9 / 25.0f, 9 / 25.0f, 17 / 25.0f, 17 / 25.0f})));
  CHECK(at::equal(p[0][2].select(-1, 0), at::tensor({0.0f, 32.0f, 0.0f, 32.0f, 0.0f, 32.0f})));

  // Layout: with fractional coordinates 1/2, 3/4, 1 on (t, h, w) the angle of
  // frequency j on axis a is w_j * {0, 1/2, 1}; frequency-major, axis-minor,
  // two pads (cos 1, sin 0) in front, each head a contiguous slice of 8.
  RopeOptions o;
  o.inner_dim = 64;
  o.heads = 4;
  o.max_pos = {20, 2048, 2048};
  const at::Tensor positions = at::tensor({10.0f, 10.0f, 1536.0f, 1536.0f, 2048.0f, 2048.0f}).view({1, 3, 1, 2});
  const RopeTables t = ltx_rope_tables(positions, o, at::kFloat);
  REQUIRE(t.cos.sizes() == at::IntArrayRef{1, 4, 1, 8});
  const at::Tensor w = ltx_frequency_grid(10000.0, 3, 64, true).to(at::kDouble);
  const at::Tensor cos = t.cos.reshape({-1}).to(at::kDouble), sin = t.sin.reshape({-1}).to(at::kDouble);
  CHECK(cos[0].item<double>() == 1.0);
  CHECK(sin[1].item<double>() == 0.0);
  const double factor[3] = {0.0, 0.5, 1.0};
  for (int64_t k = 2; k < 32; ++k) {
    INFO("angle " << k);
    const double angle = w[(k - 2) / 3].item<double>() * factor[(k - 2) % 3];
    CHECK(std::abs(cos[k].item<double>() - std::cos(angle)) < 2e-3);  // angles up to 1.6e4 rad in fp32
    CHECK(std::abs(sin[k].item<double>() - std::sin(angle)) < 2e-3);
  }
  // Rotation pairs element i of each head's first half with element i of its
  // second half; zero angles leave a vector unchanged.
  const RopeTables identity{at::ones({1, 2, 1, 4}), at::zeros({1, 2, 1, 4})};
  const at::Tensor x = at::randn({1, 1, 16});
  CHECK(at::equal(apply_ltx_rope(x, identity), x));
  const RopeTables quarter{at::zeros({1, 2, 1, 4}), at::ones({1, 2, 1, 4})};
  const at::Tensor r = apply_ltx_rope(x, quarter).view({2, 2, 4});
  const at::Tensor h = x.view({2, 2, 4});
  CHECK(at::equal(r.select(1, 0), -h.select(1, 1)));
  CHECK(at::equal(r.select(1, 1), h.select(1, 0)));
}

TEST_CASE("ltx: single-file checkpoint names load / non-DiT tensors are skipped", "[models][ltx]") {
  const io::SafetensorsFile weights(fixture_path("ltx/weights.safetensors"));
  io::NamedTensors plain, bundle;
  for (const std::string& name : weights.names()) {
    plain.emplace_back(name.substr(std::string("model.diffusion_model.").size()), weights.get(name));
    bundle.emplace_back(name, weights.get(name));
  }
  for (const char* other :
       {"vae.decoder.conv.weight", "audio_vae.encoder.conv.weight", "vocoder.ups.0.weight",
        "text_embedding_projection.weight", "model.diffusion_model.video_embeddings_connector.learnable_registers",
        "model.diffusion_model.audio_embeddings_connector.learnable_registers"})
    bundle.emplace_back(other, at::zeros({3}));
  const std::string dir = test::fresh_output_dir("ltx_checkpoint_names");
  io::write_safetensors(dir + "/plain.safetensors", plain);
  io::write_safetensors(dir + "/bundle.safetensors", bundle);
  auto reference = test::fixture_family("ltx");
  const ReferenceCase c = load_reference_case(fixture_path("ltx/case_0.safetensors"));
  const auto expected = run_reference_case(*reference, c, false);
  for (const std::string file : {"plain", "bundle"}) {
    INFO(file);
    FamilyOptions o;
    o.family = "ltx";
    o.config_json = fixture_path("ltx/config.json");
    auto model = create_family(o);
    load_weights(*model, io::Checkpoint(dir + "/" + file + ".safetensors"));
    CHECK(at::equal(run_reference_case(*model, c, false).at("output.video"), expected.at("output.video")));
  }
  auto model = std::make_shared<LTX>(fixture_config("ltx"), FamilyOptions{});
  CHECK(model->checkpoint_name("model.diffusion_model.proj_out.bias") == std::optional<std::string>("proj_out.bias"));
  CHECK(model->checkpoint_name("proj_out.bias") == std::optional<std::string>("proj_out.bias"));
  CHECK_FALSE(model->checkpoint_name("vae.decoder.conv.weight"));
  CHECK_FALSE(model->checkpoint_name("model.diffusion_model.audio_embeddings_connector.x"));
}

TEST_CASE("ltx: config from config.json / from checkpoint metadata / and its errors", "[models][ltx]") {
  const LtxConfig c = fixture_config("ltx");
  CHECK(c.inner_dim() == 64);
  CHECK(c.audio_inner_dim() == 32);
  CHECK(c.apply_gated_attention);
  CHECK(c.cross_attention_adaln);
  CHECK_FALSE(c.caption_projection);
  CHECK(c.double_precision_rope);
  CHECK(c.av_ca_timestep_scale_multiplier == 1000);
  const LtxConfig c20 = fixture_config("ltx_2_0");
  CHECK(c20.caption_projection);
  CHECK(c20.caption_channels == 48);
  CHECK(c20.adaln_rows() == 6);
  // ltx_core's checkpoint layout: the config travels in the file's own metadata.
  FamilyOptions o;
  o.family = "ltx";
  o.device = c10::kMeta;
  o.config_json = fixture_path("ltx/weights.safetensors");
  auto from_metadata = create_family(o);
  o.config_json = fixture_path("ltx/config.json");
  auto from_file = create_family(o);
  std::vector<std::string> a, b;
  for (const auto& p : from_metadata->named_parameters()) a.push_back(p.key() + c10::str(p.value().sizes()));
  for (const auto& p : from_file->named_parameters()) b.push_back(p.key() + c10::str(p.value().sizes()));
  CHECK(a == b);
  CHECK(a.size() == io::SafetensorsFile(fixture_path("ltx/weights.safetensors")).names().size());

  const auto error = [](const std::string& text) -> std::string {
    try {
      LtxConfig::from_json(text, "bad/config.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string base = R"("rope_type": "split", "num_attention_heads": 2, "attention_head_dim": 32,
      "cross_attention_dim": 64, "audio_num_attention_heads": 2, "audio_attention_head_dim": 16,
      "audio_cross_attention_dim": 32)";
  CHECK(error("{\"transformer\": {" + base + "}}").empty());
  CHECK_THAT(error("{" + base + ", \"num_layerz\": 3}"), Contains("bad/config.json") && Contains("num_layerz"));
  CHECK_THAT(error("{" + base + ", \"rope_type\": \"interleaved\"}"), Contains("rope_type \"interleaved\""));
  CHECK_THAT(error("{" + base + ", \"qk_norm\": \"layer_norm\"}"), Contains("'qk_norm' = \"layer_norm\""));
  CHECK_THAT(error("{" + base + ", \"audio_num_attention_heads\": 4}"),
             Contains("audio_num_attention_heads 4 must equal num_attention_heads 2"));
  CHECK_THAT(error("{" + base + ", \"cross_attention_dim\": 48}"), Contains("cross_attention_dim 48 must equal"));
  CHECK_THAT(error("{" + base + ", \"num_layers\": \"two\"}"), Contains("'num_layers' must be an integer"));
  CHECK_THAT(error("{" + base + ", \"frequencies_precision\": \"bfloat16\"}"), Contains("frequencies_precision"));
  CHECK_THAT(error("{"), Contains("not valid JSON"));
  // A checkpoint's own metadata may carry keys of newer ltx_core features.
  CHECK(LtxConfig::from_json("{" + base + ", \"connector_num_layers\": 8}", "ckpt", false).inner_dim() == 64);
  CHECK_THROWS_WITH(LtxConfig::preset("ltx-3"), Contains("unknown ltx preset 'ltx-3'") && Contains("ltx-2.3"));
}

TEST_CASE("ltx: presets have the released parameter counts / built on the meta device", "[models][ltx]") {
  struct Expected {
    const char* preset;
    int64_t params;
  };
  // docs/families.md §3.2: ltx_core's modules built at
  // full size (LTX-2.3: video branch and full A/V transformer; LTX-2 with
  // its two caption projections).
  for (const Expected& e :
       {Expected{"ltx-2.3", 18988838144}, Expected{"ltx-2.3-video", 13124316288}, Expected{"ltx-2", 18876174592}}) {
    INFO(e.preset);
    FamilyOptions o;
    o.family = "ltx";
    o.preset = e.preset;
    o.device = c10::kMeta;
    auto family = create_family(o);
    for (const auto& p : family->parameters()) CHECK(p.is_meta());
    CHECK(test::parameter_count(family->parameters()) == e.params);
    CHECK(family->wrap_units().size() == 48u);
  }
  FamilyOptions o;
  o.family = "ltx";
  o.device = c10::kMeta;
  o.preset = "ltx-2";
  int64_t captions = 0, video = 0;
  for (const auto& p : create_family(o)->named_parameters())
    if (p.key().find("caption_projection.") != std::string::npos) captions += p.value().numel();
  CHECK(captions == 44576768);
  o.preset = "ltx-2-video";
  for (const auto& p : create_family(o)->parameters()) video += p.numel();
  CHECK(std::llround(video / 1e6) == 13042);  // 13.042 B incl. the 0.033 B video caption projection
  o.preset = "ltx-2.3";
  const auto names = create_family(o)->named_parameters();
  CHECK(names["transformer_blocks.47.scale_shift_table"].sizes() == at::IntArrayRef{9, 4096});
  CHECK(names["transformer_blocks.0.attn1.to_gate_logits.weight"].sizes() == at::IntArrayRef{32, 4096});
  CHECK(names["transformer_blocks.0.audio_to_video_attn.to_q.weight"].sizes() == at::IntArrayRef{2048, 4096});
  CHECK(names["prompt_adaln_single.linear.weight"].sizes() == at::IntArrayRef{8192, 4096});
  CHECK_FALSE(names.contains("caption_projection.linear_1.weight"));
}

TEST_CASE("ltx: noise_pred reads sigma / builds positions from the grid / round-trips through x0", "[models][ltx]") {
  // case_2 is the video-only path of the A+V model: one sigma for every token.
  FamilyOptions o;
  o.latent_grid = {2, 2, 3, 24.0};
  auto family = test::fixture_family("ltx", o);
  auto* ltx = dynamic_cast<LTX*>(family.get());
  REQUIRE(ltx);
  const ReferenceCase c = load_reference_case(fixture_path("ltx/case_2.safetensors"));
  const at::Tensor x = c.inputs.at("video.latent");
  const at::Tensor sigma = c.inputs.at("video.sigma");
  const Cond cond = context_of(c.inputs.at("video.context"));
  torch::NoGradGuard no_grad;
  const at::Tensor v = family->noise_pred(x, sigma * 1000, sigma, cond, {});
  // The reference forward with one AdaLN row per sample (the fixture stores
  // the same sigma per token) and the fixture's positions.
  auto inputs = c.inputs;
  inputs["video.timesteps"] = sigma.view({1, 1});
  const at::Tensor raw = family->reference_forward(inputs, "{}", {}).at("output.video");
  const at::Tensor x0 = x - raw * sigma.view({1, 1, 1});
  CHECK(at::equal(v, (x - x0) / sigma.view({1, 1, 1})));
  // One AdaLN row per sample instead of one per token changes the GEMM's
  // shape and so its blocking: measured 6 fp32 ulps of the output's max with
  // MKL's Intel code paths (bound 12), 15 on an AMD EPYC (2026-12-02), where
  // the fixture bound for that CPU comes on top.
  CHECK(test::fp32_ulps_off(v, c.stored.at("output.video")) <= 12 + test::fixture_fp32_ulps("ltx"));
  // The timesteps array is never read; a different sigma is a different velocity.
  CHECK(at::equal(v, family->noise_pred(x, at::full({1}, NAN), sigma, cond, {})));
  CHECK_FALSE(at::equal(v, family->noise_pred(x, sigma * 1000, sigma * 0.999f, cond, {})));
  CHECK(family->timestep_domain() == TimestepDomain::Sigma);
  CHECK_FALSE(family->supports_cfg());
  CHECK(family->latent_shape(2, LatentGrid{2, 2, 3, 24.0}) == std::vector<int64_t>{2, 12, 16});
  REQUIRE(family->cond_spec().size() == 1);
  CHECK(family->cond_spec()[0].name == "video.context");
  // A config.json does not say how long prompts are: the connector's 1024 tokens.
  CHECK(family->cond_spec()[0].shape == std::vector<int64_t>{1024, 64});
  CHECK_THROWS_WITH(family->noise_pred(at::randn({1, 10, 16}), sigma, sigma, cond, {}),
                    Contains("10 tokens") && Contains("2x2x3"));
  CHECK_THROWS_WITH(family->noise_pred(x, sigma, sigma, Cond{}, {}), Contains("'video.context' is missing"));
  // An integer context mask becomes ltx_core's additive bias; masking tokens changes the result.
  Cond masked = cond;
  masked.tensors["video.context_mask"] = at::tensor({1, 1, 1, 0, 0}, at::kLong).view({1, 5});
  CHECK_FALSE(at::equal(v, family->noise_pred(x, sigma, sigma, masked, {})));
  // A mask that masks nothing is never passed to attention (it would change the kernel).
  masked.tensors["video.context_mask"] = at::ones({1, 5}, at::kLong);
  CHECK(at::equal(v, family->noise_pred(x, sigma, sigma, masked, {})));
  masked.tensors["video.context_mask"] = at::zeros({1, 1, 1, 5});
  CHECK(at::equal(v, family->noise_pred(x, sigma, sigma, masked, {})));
  // Decided from the mask's host copy (what Cond::to keeps), not the device tensor.
  masked.tensors["video.context_mask"] = at::tensor({1, 1, 1, 0, 0}, at::kLong).view({1, 5});
  masked.host["video.context_mask"] = at::ones({1, 5}, at::kLong);
  CHECK(at::equal(v, family->noise_pred(x, sigma, sigma, masked, {})));
  masked.host.clear();
  masked.tensors["video.context_mask"] = at::ones({1, 5}, at::kBool);
  CHECK_THROWS_WITH(family->noise_pred(x, sigma, sigma, masked, {}), Contains("bool mask"));

  // bf16 forward: latents and text in bf16, sigma stays fp32; x0 rounded to bf16.
  FamilyOptions b = o;
  using precision::InputDtype;
  b.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, at::kBFloat16);
  auto bf16 = test::fixture_family("ltx", b);
  cast_parameters(*bf16, at::kBFloat16, bf16->default_overrides());
  const at::Tensor vb = bf16->noise_pred(x, sigma, sigma, cond, {});
  CHECK(vb.scalar_type() == at::kBFloat16);
  for (const char* name : {"video.latent", "video.context"}) inputs[name] = inputs[name].to(at::kBFloat16);
  const at::Tensor rb = bf16->reference_forward(inputs, "{}", {}).at("output.video");
  const at::Tensor xb = inputs.at("video.latent").to(at::kFloat);
  const at::Tensor sb = sigma.to(at::kBFloat16).to(at::kFloat).view({1, 1, 1});
  const at::Tensor x0b = (xb - rb.to(at::kFloat) * sb).to(at::kBFloat16).to(at::kFloat);
  CHECK(at::equal(vb, ((xb - x0b) / sb).to(at::kBFloat16)));
}

TEST_CASE("ltx: blocks run through the unit runner / audio is frozen and unused on the video path", "[models][ltx]") {
  FamilyOptions o;
  o.family = "ltx";
  o.init_seed = 5;
  o.latent_grid = {2, 3, 2, 24.0};
  auto family = create_family(o);
  const std::vector<WrapUnit> units = family->wrap_units();
  REQUIRE(units.size() == 2);
  CHECK(units[1].name == "transformer_blocks.1");
  const at::Tensor x = at::randn({2, 12, 16});
  const at::Tensor sigma = at::tensor({0.3f, 0.9f});
  const Cond cond = context_of(at::randn({2, 8, 64}));
  {
    torch::NoGradGuard no_grad;
    const at::Tensor direct = family->noise_pred(x, sigma, sigma, cond, {});
    CountingRunner runner;
    ForwardContext ctx;
    ctx.runner = &runner;
    CHECK(at::equal(direct, family->noise_pred(x, sigma, sigma, cond, ctx)));
    CHECK(runner.order == std::vector<size_t>{0, 1});
  }
  family->noise_pred(x, sigma, sigma, cond, {}).square().mean().backward();
  size_t audio = 0;
  for (const auto& p : family->named_parameters()) {
    INFO(p.key());
    if (LTX::is_audio_parameter(p.key())) {
      ++audio;
      CHECK_FALSE(p.value().requires_grad());
      CHECK_FALSE(p.value().grad().defined());
    } else {
      REQUIRE(p.value().grad().defined());
      CHECK(at::isfinite(p.value().grad()).all().item<bool>());
      CHECK(p.value().grad().abs().sum().item<double>() > 0);
    }
  }
  CHECK(audio > 0);
  CHECK(LTX::is_audio_parameter("transformer_blocks.3.video_to_audio_attn.to_q.weight"));
  CHECK(LTX::is_audio_parameter("av_ca_a2v_gate_adaln_single.linear.weight"));
  CHECK_FALSE(LTX::is_audio_parameter("transformer_blocks.3.attn1.to_q.weight"));
  CHECK_FALSE(LTX::is_audio_parameter("transformer_blocks.3.scale_shift_table"));
}

TEST_CASE("ltx: LoRA on the default targets adapts the video stream only", "[models][ltx]") {
  FamilyOptions o;
  o.family = "ltx";
  o.latent_grid = {2, 2, 3, 24.0};
  o.init_seed = 11;
  auto base = create_family(o);
  o.lora.enabled = true;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  auto adapted = create_family(o);
  std::set<std::string> modules;
  for (const auto& p : adapted->named_parameters()) {
    if (p.key().find(".lora_A.") != std::string::npos) modules.insert(p.key().substr(0, p.key().find(".lora_A.")));
    CHECK(p.value().requires_grad() == (p.key().find(".lora_") != std::string::npos));
  }
  CHECK(modules.size() == 2 * 10u);
  for (const std::string& m : modules) CHECK_FALSE(LTX::is_audio_parameter(m + ".weight"));
  CHECK(modules.count("transformer_blocks.1.attn2.to_out.0"));
  CHECK(modules.count("transformer_blocks.0.ff.net.0.proj"));
  const at::Tensor x = at::randn({1, 12, 16});
  const at::Tensor sigma = at::tensor({0.5f});
  const Cond cond = context_of(at::randn({1, 8, 64}));
  torch::NoGradGuard no_grad;
  // B = 0: the adapted model computes the base model's output bit for bit.
  const at::Tensor v = adapted->noise_pred(x, sigma, sigma, cond, {});
  CHECK(at::equal(v, base->noise_pred(x, sigma, sigma, cond, {})));
  for (const auto& p : adapted->named_parameters())
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0, 0.1);
  CHECK_FALSE(at::equal(v, adapted->noise_pred(x, sigma, sigma, cond, {})));
  {
    LoraDisableGuard off;
    CHECK(at::equal(v, adapted->noise_pred(x, sigma, sigma, cond, {})));
  }
}

TEST_CASE("ltx: reference_forward input errors name the input", "[models][ltx]") {
  auto family = test::fixture_family("ltx");
  const ReferenceCase c = load_reference_case(fixture_path("ltx/case_0.safetensors"));
  torch::NoGradGuard no_grad;
  auto inputs = c.inputs;
  inputs["video.extra"] = at::zeros({1});
  CHECK_THROWS_WITH(family->reference_forward(inputs, "{}", {}), Contains("unexpected input 'video.extra'"));
  inputs = c.inputs;
  inputs.erase("audio.context");
  CHECK_THROWS_WITH(family->reference_forward(inputs, "{}", {}), Contains("'audio.context' is missing"));
  inputs = c.inputs;
  inputs["video.positions"] = inputs["video.positions"].slice(2, 0, 5);
  CHECK_THROWS_WITH(family->reference_forward(inputs, "{}", {}), Contains("'video.positions' has shape [1, 3, 5, 2]"));
  inputs = c.inputs;
  inputs["video.latent"] = inputs["video.latent"].to(at::kBFloat16);
  CHECK_THROWS_WITH(family->reference_forward(inputs, "{}", {}),
                    Contains("'video.latent' is bf16 but the weights are fp32"));
  FamilyOptions o;
  o.family = "ltx";
  o.preset = "tiny-video";
  auto video_only = create_family(o);
  CHECK_THROWS_WITH(video_only->reference_forward(c.inputs, "{}", {}), Contains("no audio stream"));
}

TEST_CASE("ltx: the deck rejects guidance and negative prompts (LTX trains unguided)", "[models][ltx][config]") {
  const auto deck_error = [](const std::string& rollout) -> std::string {
    try {
      config::parse_deck("[model]\nfamily = \"ltx\"\n[rollout]\n" + rollout, "ltx.toml");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(deck_error("guidance_scale = 1.0\nframes = 3\nfps = 25.0\n").empty());
  CHECK_THAT(deck_error("guidance_scale = 3.0\n"), Contains("ltx.toml") && Contains("LTX trains unguided"));
  CHECK_THAT(deck_error("negative_prompt = true\n"), Contains("LTX trains unguided"));
  CHECK_THAT(deck_error("fps = 0.0\n"), Contains("fps"));
}

TEST_CASE("cli: ditrl inspect --family ltx accepts the fixture weights and lists each problem", "[app][cli][ltx]") {
  const std::string weights = fixture_path("ltx/weights.safetensors");
  const std::string config = fixture_path("ltx/config.json");
  const auto valid =
      test::run_process(fmt::format("{} inspect {} --family ltx --config {}", DITRL_BINARY, weights, config));
  INFO(valid.output);
  CHECK(valid.exit_code == 0);
  CHECK_THAT(valid.output, Contains("# matches family ltx"));
  const auto own =
      test::run_process(fmt::format("{} inspect {} --family ltx --config {}", DITRL_BINARY, weights, weights));
  CHECK(own.exit_code == 0);

  const io::SafetensorsFile file(weights);
  io::NamedTensors tensors;
  for (const std::string& name : file.names()) {
    at::Tensor t = file.get(name);
    std::string stored = name;
    if (name == "model.diffusion_model.transformer_blocks.1.attn1.to_gate_logits.weight")
      stored = "model.diffusion_model.transformer_blocks.1.attn1.gate_logits.weight";
    if (name == "model.diffusion_model.proj_out.weight") t = at::zeros({16, 32});
    tensors.emplace_back(stored, t);
  }
  tensors.emplace_back("vae.decoder.conv_in.weight", at::zeros({2}));
  const std::string bad = test::fresh_output_dir("ltx_inspect") + "/bad.safetensors";
  io::write_safetensors(bad, tensors);
  const auto rejected =
      test::run_process(fmt::format("{} inspect {} --family ltx --config {}", DITRL_BINARY, bad, config));
  INFO(rejected.output);
  CHECK(rejected.exit_code != 0);
  CHECK_THAT(
      rejected.output,
      Contains(bad) && Contains("besides 1 that are not part of the model") &&
          Contains("missing (1): transformer_blocks.1.attn1.to_gate_logits.weight") &&
          Contains("unexpected (1): model.diffusion_model.transformer_blocks.1.attn1.gate_logits.weight") &&
          Contains("wrong shape (1): model.diffusion_model.proj_out.weight (checkpoint [16, 32], model [16, 64])"));
}
