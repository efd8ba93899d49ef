#include <ditrl/cuda_build.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/adaln.hpp>
#include <ditrl/models/attention.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/feed_forward.hpp>
#include <ditrl/models/norms.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <catch2/catch.hpp>

#include "model_fixtures.hpp"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

using namespace ditrl::models;
using Catch::Matchers::Contains;
using ditrl::test::max_abs_diff;

namespace {

const at::TensorOptions kCpu = at::TensorOptions().dtype(at::kFloat);

// A module's parameters from a seeded init.
template <class M>
std::shared_ptr<M> seeded(std::shared_ptr<M> module, int64_t seed) {
  init_parameters(*module, seed);
  return module;
}

}  // namespace

TEST_CASE("layers: timestep sinusoid follows get_timestep_embedding", "[models][layers]") {
  const at::Tensor t = at::tensor({0.0f, 3.0f, 917.5f});
  const at::Tensor emb = timestep_sinusoid(t, SinusoidOptions{});
  REQUIRE(emb.sizes() == at::IntArrayRef{3, 256});
  CHECK(emb.scalar_type() == at::kFloat);
  // flip_sin_to_cos: [cos | sin] of t * 10000^(-i/128).
  for (int64_t row = 0; row < 3; ++row)
    for (int64_t i : {0, 1, 64, 127}) {
      const double angle = t[row].item<double>() * std::exp(-std::log(10000.0) * i / 128.0);
      CHECK(emb[row][i].item<double>() == Approx(std::cos(angle)).margin(2e-4));
      CHECK(emb[row][128 + i].item<double>() == Approx(std::sin(angle)).margin(2e-4));
    }
  SinusoidOptions o;
  o.dim = 9;
  o.flip_sin_to_cos = false;
  o.shift = 1;
  const at::Tensor odd = timestep_sinusoid(at::tensor({2.0f}), o);
  REQUIRE(odd.sizes() == at::IntArrayRef{1, 9});
  CHECK(odd[0][8].item<double>() == 0.0);                    // odd dims are zero-padded
  const double f1 = std::exp(-std::log(10000.0) * 1 / 3.0);  // half - shift = 3
  CHECK(odd[0][1].item<double>() == Approx(std::sin(2 * f1)).margin(1e-6));
  CHECK(odd[0][5].item<double>() == Approx(std::cos(2 * f1)).margin(1e-6));
  // The scale multiplies t * f (Qwen-Image's 1000): not the same op as scaling t first.
  SinusoidOptions qwen;
  qwen.scale = 1000;
  const at::Tensor sigma = at::tensor({0.2478f, 0.6631f, 0.9912f});
  const at::Tensor scaled_after = timestep_sinusoid(sigma, qwen);
  const at::Tensor scaled_first = timestep_sinusoid(sigma * 1000, SinusoidOptions{});
  CHECK(max_abs_diff(scaled_after, scaled_first) < 1e-3);
  CHECK_FALSE(at::equal(scaled_after, scaled_first));
  CHECK_THROWS_WITH(timestep_sinusoid(at::ones({2, 2}), SinusoidOptions{}), Contains("1-D"));
}

TEST_CASE("layers: the 2-D sin-cos table is the reference's buffer bit for bit", "[models][layers]") {
  const ditrl::io::SafetensorsFile weights(ditrl::test::fixture_path("sd3/weights.safetensors"));
  // The fixture: pos_embed_max_size 16, sample 16 / patch 2 -> base size 8, D = 64.
  const at::Tensor table = sincos_pos_embed_2d(64, 16, 8.0, 1.0);
  CHECK(at::equal(table.unsqueeze(0), weights.get("pos_embed.pos_embed")));
  // Token r*M + c is [S(col) | S(row)], S(u) = [sin(u w_k) | cos(u w_k)], u = index * 8/16.
  const int64_t r = 5, c = 11;
  for (int64_t k : {0, 3, 15}) {
    const double omega = std::pow(10000.0, -k / 16.0);
    CHECK(table[r * 16 + c][k].item<double>() == Approx(std::sin(c * 0.5 * omega)).margin(1e-6));
    CHECK(table[r * 16 + c][16 + k].item<double>() == Approx(std::cos(c * 0.5 * omega)).margin(1e-6));
    CHECK(table[r * 16 + c][32 + k].item<double>() == Approx(std::sin(r * 0.5 * omega)).margin(1e-6));
    CHECK(table[r * 16 + c][48 + k].item<double>() == Approx(std::cos(r * 0.5 * omega)).margin(1e-6));
  }
}

TEST_CASE("layers: the 2-D sin-cos table equals the fp64 meshgrid formula bit for bit at SD3.5 widths",
          "[models][layers]") {
  // The formula as diffusers writes it: the whole (grid*grid, dim) table in
  // fp64 from the meshgrid, cast once (what sincos_pos_embed_2d builds from
  // one small table instead).
  const int64_t dim = 1536, grid = 48;
  const double base = 64.0;
  const at::Tensor coords = at::arange(grid, at::TensorOptions().dtype(at::kFloat)) / (grid / base);
  const std::vector<at::Tensor> mesh = at::meshgrid({coords, coords}, "xy");
  const auto one_d = [](int64_t d, const at::Tensor& pos) {
    const at::Tensor omega =
        at::pow(10000.0, at::arange(d / 2, at::TensorOptions().dtype(at::kDouble)) / (d / 2.0)).reciprocal();
    const at::Tensor angles = pos.reshape({-1, 1}).to(at::kDouble) * omega.unsqueeze(0);
    return at::cat({at::sin(angles), at::cos(angles)}, 1);
  };
  const at::Tensor expected = at::cat({one_d(dim / 2, mesh[0]), one_d(dim / 2, mesh[1])}, 1).to(at::kFloat);
  CHECK(at::equal(sincos_pos_embed_2d(dim, grid, base, 1.0), expected));
}

TEST_CASE("layers: patch embedding crops the table at the centre", "[models][layers]") {
  PatchEmbed embed(4, 64, 2, 16, 8.0, kCpu, kCpu);
  const at::Tensor crop = embed.cropped_pos_embed(3, 6);  // top (16-3)/2 = 6, left (16-6)/2 = 5
  REQUIRE(crop.sizes() == at::IntArrayRef{1, 18, 64});
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 6; ++c) CHECK(at::equal(crop[0][r * 6 + c], embed.pos_embed[0][(6 + r) * 16 + 5 + c]));
  CHECK_THROWS_WITH(embed.cropped_pos_embed(17, 2), Contains("exceeds pos_embed_max_size 16"));
  // Tokens are row-major over the patch grid.
  init_parameters(embed, 1);
  const at::Tensor latent = at::randn({1, 4, 6, 12});
  const at::Tensor tokens = embed.forward(latent);
  REQUIRE(tokens.sizes() == at::IntArrayRef{1, 18, 64});
  const at::Tensor patch = latent.slice(2, 2, 4).slice(3, 8, 10);  // row 1, column 4
  const at::Tensor expected = (embed.proj->weight * patch).sum({1, 2, 3}) + embed.proj->bias + crop[0][1 * 6 + 4];
  CHECK(max_abs_diff(tokens[0][1 * 6 + 4], expected) < 1e-5);
}

TEST_CASE("layers: the sin-cos table's window equals the whole table's rows bit for bit", "[models][layers]") {
  // SD3.5 widths; odd and even windows, at the edges and in the middle.
  const int64_t dim = 1536, grid = 48;
  const at::Tensor whole = sincos_pos_embed_2d(dim, grid, 32.0, 1.0).view({grid, grid, dim});
  for (const GridWindow w : {GridWindow{0, 0, 1, 1}, GridWindow{20, 17, 8, 13}, GridWindow{47, 0, 1, 48},
                             GridWindow::centre(grid, 7, 10), GridWindow{0, 0, grid, grid}}) {
    INFO(w.top << " " << w.left << " " << w.height << " " << w.width);
    const at::Tensor expected =
        whole.slice(0, w.top, w.top + w.height).slice(1, w.left, w.left + w.width).reshape({-1, dim});
    CHECK(at::equal(sincos_pos_embed_window(dim, grid, 32.0, 1.0, w), expected));
  }
  CHECK_THROWS_WITH(sincos_pos_embed_window(dim, grid, 32.0, 1.0, {45, 0, 4, 4}), Contains("outside the 48x48 grid"));
}

TEST_CASE("layers: a windowed patch embedding forwards bit for bit as the whole table does", "[models][layers]") {
  // Window of an 8x6-patch latent in a 16x16 table: rows [4, 12), columns [5, 11).
  PatchEmbed whole(4, 64, 2, 16, 8.0, kCpu, kCpu);
  PatchEmbed windowed(4, 64, 2, 16, 8.0, kCpu, kCpu, std::pair<int64_t, int64_t>{8, 6});
  REQUIRE(windowed.windowed());
  CHECK(windowed.pos_embed.is_meta());  // the registered buffer keeps its full shape, holding nothing
  CHECK(windowed.pos_embed.sizes() == at::IntArrayRef{1, 256, 64});
  CHECK(windowed.window_values().sizes() == at::IntArrayRef{1, 48, 64});
  init_parameters(whole, 3);
  init_parameters(windowed, 3);
  // The window's own grid and smaller grids whose centre crop lies inside it.
  for (const auto& [h, w] : {std::pair<int64_t, int64_t>{8, 6}, {6, 6}, {2, 4}}) {
    INFO(h << "x" << w);
    CHECK(at::equal(windowed.cropped_pos_embed(h, w), whole.cropped_pos_embed(h, w)));
    const at::Tensor latent = at::randn({2, 4, 2 * h, 2 * w}).to(at::kBFloat16);
    CHECK(at::equal(windowed.forward(latent.to(at::kFloat)), whole.forward(latent.to(at::kFloat))));
  }
  // A grid that reads outside the window is an error naming both grids.
  CHECK_THROWS_WITH(windowed.cropped_pos_embed(10, 6),
                    Contains("holds only the centre crop of a 8x6-patch latent grid") && Contains("a 10x6-patch grid"));
  CHECK_THROWS_WITH(windowed.forward(at::zeros({1, 4, 16, 14})), Contains("outside it"));
  CHECK_THROWS_WITH(whole.fill_window([](int64_t, int64_t) { return at::Tensor(); }), Contains("whole table"));
}

TEST_CASE("layers: a windowed patch embedding reads only its rows of a table that is not the formula",
          "[models][layers]") {
  // A checkpoint's table (bf16 here) is what the window must hold, not the computed one.
  const at::Tensor table = at::randn({1, 16 * 16, 64}).to(at::kBFloat16);
  PatchEmbed windowed(4, 64, 2, 16, 8.0, kCpu, kCpu, std::pair<int64_t, int64_t>{3, 5});
  int64_t elements = 0;
  windowed.fill_window([&](int64_t begin, int64_t end) {
    elements += end - begin;
    return table.reshape(-1).slice(0, begin, end).clone();
  });
  CHECK(elements == 3 * 5 * 64);  // only the window's rows are read
  PatchEmbed whole(4, 64, 2, 16, 8.0, kCpu, kCpu);
  whole.pos_embed.copy_(table);  // load_weights' copy: bf16 -> fp32
  CHECK(at::equal(windowed.cropped_pos_embed(3, 5), whole.cropped_pos_embed(3, 5)));
  CHECK_FALSE(
      at::equal(whole.cropped_pos_embed(3, 5), PatchEmbed(4, 64, 2, 16, 8.0, kCpu, kCpu).cropped_pos_embed(3, 5)));
}

TEST_CASE("layers: unpatchify puts feature (py px c) of token (r w) at pixel (r p + py / w p + px)",
          "[models][layers]") {
  const int64_t h = 3, w = 4, p = 2, channels = 5;
  const at::Tensor x = at::arange(2 * h * w * p * p * channels, at::kFloat).reshape({2, h * w, p * p * channels});
  const at::Tensor img = unpatchify_2d(x, h, w, p, channels);
  REQUIRE(img.sizes() == at::IntArrayRef{2, channels, h * p, w * p});
  for (int64_t b : {0, 1})
    for (int64_t r : {0, 2})
      for (int64_t col : {1, 3})
        for (int64_t py : {0, 1})
          for (int64_t px : {0, 1})
            for (int64_t c : {0, 4})
              CHECK(img[b][c][r * p + py][col * p + px].item<float>() ==
                    x[b][r * w + col][(py * p + px) * channels + c].item<float>());
}

TEST_CASE("layers: RMSNorm flavours round where their references do", "[models][layers]") {
  const at::Tensor x = at::randn({3, 16}).to(at::kBFloat16);
  const at::Tensor w = (1 + 0.1 * at::randn({16})).to(at::kBFloat16);
  const at::Tensor normed = x.to(at::kFloat) * at::rsqrt(x.to(at::kFloat).pow(2).mean(-1, true) + 1e-6);
  // diffusers: normalised value rounded to the (bf16) weight dtype, bf16 * bf16.
  const at::Tensor diffusers = rms_norm(x, w, 1e-6, RmsFlavour::Diffusers);
  CHECK(diffusers.scalar_type() == at::kBFloat16);
  CHECK(at::equal(diffusers, normed.to(at::kBFloat16) * w));
  // diffusers with an fp32 weight keeps fp32.
  CHECK(rms_norm(x, w.to(at::kFloat), 1e-6, RmsFlavour::Diffusers).scalar_type() == at::kFloat);
  // torch F.rms_norm: the weight multiplied in fp32, one rounding to bf16.
  CHECK(at::equal(rms_norm(x, w, 1e-6, RmsFlavour::Torch), (normed * w.to(at::kFloat)).to(at::kBFloat16)));
  CHECK(at::equal(rms_norm(x, {}, 1e-6, RmsFlavour::Torch), normed.to(at::kBFloat16)));
  const at::Tensor y = rms_norm(at::randn({4, 32}) * 7, {}, 1e-6, RmsFlavour::Diffusers);
  CHECK(max_abs_diff(y.pow(2).mean(-1), at::ones({4})) < 1e-5);
}

TEST_CASE("layers: LayerNorm without affine / and the fp32 affine variant", "[models][layers]") {
  const at::Tensor x = at::randn({2, 5, 32}) * 3 + 1;
  const at::Tensor y = layer_norm(x, 1e-6);
  CHECK(max_abs_diff(y.mean(-1), at::zeros({2, 5})) < 1e-5);
  CHECK(max_abs_diff(y.var(-1, false), at::ones({2, 5})) < 1e-4);
  auto ln = seeded(std::make_shared<LayerNorm>(32, 1e-6, true, true, kCpu), 2);
  const at::Tensor xb = x.to(at::kBFloat16);
  const at::Tensor out = ln->forward(xb);
  CHECK(out.scalar_type() == at::kBFloat16);
  CHECK(at::equal(out, (layer_norm(xb.to(at::kFloat), 1e-6) * ln->weight + ln->bias).to(at::kBFloat16)));
  CHECK(ln->named_parameters().size() == 2);
}

TEST_CASE("layers: math attention / masks and joint attention orders", "[models][layers]") {
  const at::Tensor q = at::randn({2, 3, 5, 8}), k = at::randn({2, 3, 7, 8}), v = at::randn({2, 3, 7, 8});
  const auto naive = [&](const at::Tensor& bias) {
    const at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) / std::sqrt(8.0) + bias;
    return at::matmul(at::softmax(s, -1), v.to(at::kDouble));
  };
  const at::Tensor none = scaled_dot_product_attention(q, k, v, {}, AttentionBackend::Math);
  CHECK(max_abs_diff(none, naive(at::zeros({1}, at::kDouble))) < 1e-5);
  // A bool mask (true = attend) and the equivalent additive mask.
  const at::Tensor keep = at::arange(7).lt(5).reshape({1, 1, 1, 7});
  const at::Tensor additive = at::where(keep, at::zeros({1}), at::full({1}, -INFINITY));
  const at::Tensor masked = scaled_dot_product_attention(q, k, v, keep, AttentionBackend::Math);
  CHECK(at::equal(masked, scaled_dot_product_attention(q, k, v, additive, AttentionBackend::Math)));
  CHECK(max_abs_diff(masked, naive(additive.to(at::kDouble))) < 1e-5);
  // With the math backend an all-true mask changes nothing.
  CHECK(at::equal(none,
                  scaled_dot_product_attention(q, k, v, at::ones({1, 1, 1, 7}, at::kBool), AttentionBackend::Math)));
  // Half inputs: fp32 inside, rounded once at the end.
  const at::Tensor qb = q.to(at::kBFloat16), kb = k.to(at::kBFloat16), vb = v.to(at::kBFloat16);
  CHECK(at::equal(
      scaled_dot_product_attention(qb, kb, vb, {}, AttentionBackend::Math),
      scaled_dot_product_attention(qb.to(at::kFloat), kb.to(at::kFloat), vb.to(at::kFloat), {}, AttentionBackend::Math)
          .to(at::kBFloat16)));
  CHECK(usable_attention_backend(AttentionBackend::Math) == AttentionBackend::Math);
  CHECK(usable_attention_backend(AttentionBackend::Flash) == AttentionBackend::Flash);
  if (!ditrl::kCudaBuild)
    for (const AttentionBackend fused : {AttentionBackend::Efficient, AttentionBackend::Cudnn})
      CHECK_THROWS_WITH(usable_attention_backend(fused), Contains("runs on CUDA only"));

  // Joint attention: image-first and text-first differ only in the order of
  // the keys, so the outputs agree to rounding.
  AttentionConfig config;
  config.dim = 32;
  config.heads = 4;
  config.head_dim = 8;
  config.qk_norm = QKNorm::PerHead;
  config.joint = true;
  auto image_first = seeded(std::make_shared<Attention>(config, kCpu), 5);
  config.order = JointOrder::TextFirst;
  auto text_first = seeded(std::make_shared<Attention>(config, kCpu), 5);
  const at::Tensor x = at::randn({2, 6, 32}), c = at::randn({2, 3, 32});
  torch::NoGradGuard no_grad;
  const auto [x1, c1] = image_first->joint_attention(x, c);
  const auto [x2, c2] = text_first->joint_attention(x, c);
  CHECK(max_abs_diff(x1, x2) < 1e-5);
  CHECK(max_abs_diff(c1, c2) < 1e-5);
  // A joint mask in the stream order: masking the last text token of sample 1.
  at::Tensor mask = at::ones({2, 1, 1, 9}, at::kBool);
  mask[1][0][0][8] = false;
  const auto [x3, c3] = image_first->joint_attention(x, c, mask);
  CHECK(at::equal(x3[0], x1[0]));
  CHECK_FALSE(at::allclose(x3[1], x1[1]));
  const auto [x4, c4] = image_first->joint_attention(x, c.slice(1, 0, 2));
  CHECK(max_abs_diff(x3[1], x4[1]) < 1e-5);  // same as dropping that token
  // The per-stream rotary hook sees (B, H, L, Dh).
  int64_t calls = 0;
  const QKRotary probe = [&](at::Tensor& qq, at::Tensor& kk) {
    CHECK(qq.sizes() == at::IntArrayRef{2, 4, 6, 8});
    CHECK(kk.sizes() == at::IntArrayRef{2, 4, 6, 8});
    ++calls;
  };
  image_first->joint_attention(x, c, {}, probe);
  CHECK(calls == 1);
}

TEST_CASE(
    "layers: flash attention on the CPU / agrees with the exact softmax with and without masks / the same "
    "bits at any thread count",
    "[models][layers]") {
  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 3, 70, 16}), k = at::randn({2, 3, 90, 16}), v = at::randn({2, 3, 90, 16});
  const auto exact = [&](const at::Tensor& bias) {
    const at::Tensor s = at::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-2, -1)) / 4.0 + bias;
    return at::matmul(at::softmax(s, -1), v.to(at::kDouble));
  };
  const at::Tensor keep = at::arange(90).lt(60).reshape({1, 1, 1, 90});
  const at::Tensor additive = at::where(keep, at::zeros({1}), at::full({1}, -INFINITY));
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, {}, AttentionBackend::Flash),
                     exact(at::zeros({1}, at::kDouble))) < 1e-5);
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, keep, AttentionBackend::Flash),
                     exact(additive.to(at::kDouble))) < 1e-5);
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, additive, AttentionBackend::Flash),
                     exact(additive.to(at::kDouble))) < 1e-5);
  // bf16 in, bf16 out, within bf16 rounding of the exact value.
  const at::Tensor qb = q.to(at::kBFloat16), kb = k.to(at::kBFloat16), vb = v.to(at::kBFloat16);
  const at::Tensor half = scaled_dot_product_attention(qb, kb, vb, {}, AttentionBackend::Flash);
  CHECK(half.scalar_type() == at::kBFloat16);
  CHECK(max_abs_diff(half, exact(at::zeros({1}, at::kDouble))) < 2e-2);

  // Deterministic mode and rank invariance need the same bits from any
  // thread count, forward and backward.
  const auto run = [&](int threads) {
    const int before = at::get_num_threads();
    at::set_num_threads(threads);
    const at::Tensor qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true),
                     vg = v.clone().requires_grad_(true);
    const at::Tensor out = scaled_dot_product_attention(qg, kg, vg, keep, AttentionBackend::Flash);
    (out * out).sum().backward();
    at::set_num_threads(before);
    return std::vector<at::Tensor>{out.detach(), qg.grad(), kg.grad(), vg.grad()};
  };
  const std::vector<at::Tensor> one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) CHECK(at::equal(one[i], two[i]));
}

TEST_CASE(
    "layers: flash attention at bf16 on the CPU / below 192 query tokens x 64 head dims the backward is the fp32 "
    "kernel's rounded "
    "once / the forward stays the bf16 kernel's bit for bit",
    "[models][layers]") {
  using ditrl::precision::CpuHalfGemm;
  at::manual_seed(4);
  // (B, L, H, Dh) transposed to (B, H, L, Dh), as the attention modules pass them.
  const auto heads_first = [](int64_t tokens, int64_t head_dim = 16) {
    return at::randn({2, tokens, 3, head_dim}).to(at::kBFloat16).transpose(1, 2).requires_grad_(true);
  };
  const auto native_half = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& additive, const at::Tensor& g) {
    const auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, additive);
    return std::make_pair(
        out, at::_scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, false, additive));
  };
  const auto grads_of = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           const at::Tensor& g) {
    for (const at::Tensor& t : {q, k, v}) t.mutable_grad() = at::Tensor();
    const at::Tensor out = scaled_dot_product_attention(q, k, v, mask, AttentionBackend::Flash);
    out.backward(g);
    return std::make_pair(out.detach(), std::vector<at::Tensor>{q.grad(), k.grad(), v.grad()});
  };
  for (const bool masked : {false, true}) {
    CAPTURE(masked);
    const at::Tensor q = heads_first(72), k = heads_first(72), v = heads_first(72);
    const at::Tensor g = at::randn({2, 3, 72, 16}).to(at::kBFloat16);
    const at::Tensor keep = masked ? at::arange(72).lt(50).reshape({1, 1, 1, 72}) : at::Tensor();
    const std::optional<at::Tensor> bias16 =
        masked ? std::optional<at::Tensor>(at::where(keep, at::zeros({1}), at::full({1}, -INFINITY)).to(at::kBFloat16))
               : std::nullopt;
    const auto [out, grads] = grads_of(q, k, v, keep, g);
    const auto [native_out, native_grads] = native_half(q.detach(), k.detach(), v.detach(), bias16, g);
    CHECK(at::equal(out, native_out));
    // The fp32 backward of the bf16 forward's output and logsumexp.
    const auto [_, lse] =
        at::_scaled_dot_product_flash_attention_for_cpu(q.detach(), k.detach(), v.detach(), 0.0, false, bias16);
    const std::optional<at::Tensor> bias32 = bias16 ? std::optional<at::Tensor>(bias16->to(at::kFloat)) : std::nullopt;
    const auto widened = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        g.to(at::kFloat), q.detach().to(at::kFloat), k.detach().to(at::kFloat), v.detach().to(at::kFloat),
        out.to(at::kFloat), lse, 0.0, false, bias32);
    CHECK(at::equal(grads[0], std::get<0>(widened).to(at::kBFloat16)));
    CHECK(at::equal(grads[1], std::get<1>(widened).to(at::kBFloat16)));
    CHECK(at::equal(grads[2], std::get<2>(widened).to(at::kBFloat16)));
    CHECK_FALSE(at::equal(grads[0], std::get<0>(native_grads)));  // the bf16 kernel's dq differs
    // Within bf16 rounding of the exact gradient (double, softmax attention).
    const at::Tensor qd = q.detach().to(at::kDouble).requires_grad_(true),
                     kd = k.detach().to(at::kDouble).requires_grad_(true),
                     vd = v.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor scores = at::matmul(qd, kd.transpose(-2, -1)) / 4.0;
    if (masked) scores = scores + bias32->to(at::kDouble);
    at::matmul(at::softmax(scores, -1), vd).backward(g.to(at::kDouble));
    CHECK(max_abs_diff(grads[0], qd.grad()) < 3e-2);
    CHECK(max_abs_diff(grads[1], kd.grad()) < 3e-2);
    CHECK(max_abs_diff(grads[2], vd.grad()) < 3e-2);
    // Deterministic at any thread count.
    const int before = at::get_num_threads();
    at::set_num_threads(2);
    const auto [out2, grads2] = grads_of(q, k, v, keep, g);
    at::set_num_threads(before);
    for (size_t i = 0; i < grads.size(); ++i) CHECK(at::equal(grads[i], grads2[i]));
  }

  // From 192 query tokens x 64 LibTorch's bf16 backward, unless half GEMMs widen.
  const at::Tensor q = heads_first(192, 64), k = heads_first(192, 64), v = heads_first(192, 64);
  const at::Tensor g = at::randn({2, 3, 192, 64}).to(at::kBFloat16);
  const auto [native_out, native_grads] = native_half(q.detach(), k.detach(), v.detach(), std::nullopt, g);
  const CpuHalfGemm mode = ditrl::precision::cpu_half_gemm();
  ditrl::precision::set_cpu_half_gemm(CpuHalfGemm::Native);
  const auto [out, grads] = grads_of(q, k, v, {}, g);
  CHECK(at::equal(grads[0], std::get<0>(native_grads)));
  ditrl::precision::set_cpu_half_gemm(CpuHalfGemm::Widened);
  const auto [out_w, grads_w] = grads_of(q, k, v, {}, g);
  ditrl::precision::set_cpu_half_gemm(mode);
  CHECK(at::equal(out_w, native_out));
  CHECK_FALSE(at::equal(grads_w[0], std::get<0>(native_grads)));
}

TEST_CASE("layers: parameter names follow the checkpoints", "[models][layers]") {
  AttentionConfig config;
  config.dim = 32;
  config.heads = 2;
  config.head_dim = 16;
  config.qk_norm = QKNorm::AcrossHeads;
  config.rms_flavour = RmsFlavour::Torch;
  config.kv_dim = 24;
  Attention cross(config, kCpu);
  const auto params = cross.named_parameters();
  CHECK(params["to_out.0.weight"].sizes() == at::IntArrayRef{32, 32});
  CHECK(params["to_k.weight"].sizes() == at::IntArrayRef{32, 24});
  CHECK(params["norm_q.weight"].sizes() == at::IntArrayRef{32});  // across heads: H * Dh
  CHECK_FALSE(params.contains("add_q_proj.weight"));
  init_parameters(cross, 4);
  torch::NoGradGuard no_grad;
  CHECK(cross.cross_attention(at::randn({1, 5, 32}), at::randn({1, 9, 24})).sizes() == at::IntArrayRef{1, 5, 32});

  FeedForward ff(8, 32, 8, true, kCpu);
  CHECK(ff.named_parameters().contains("net.0.proj.weight"));
  CHECK(ff.named_parameters()["net.2.weight"].sizes() == at::IntArrayRef{8, 32});
  init_parameters(ff, 1);
  const at::Tensor x = at::randn({2, 8});
  CHECK(at::equal(ff.forward(x), at::linear(at::gelu(at::linear(x, ff.proj->weight, ff.proj->bias), "tanh"),
                                            ff.out->weight, ff.out->bias)));

  // AdaLN-continuous chunks (scale, shift): scale first.
  AdaLayerNormContinuous norm(8, 4, 1e-6, kCpu);
  init_parameters(norm, 6);
  const at::Tensor cond = at::randn({2, 4}), h = at::randn({2, 3, 8});
  const auto emb = at::linear(at::silu(cond), norm.linear->weight, norm.linear->bias).chunk(2, 1);
  CHECK(at::equal(norm.forward(h, cond), layer_norm(h, 1e-6) * (1 + emb[0].unsqueeze(1)) + emb[1].unsqueeze(1)));
}
