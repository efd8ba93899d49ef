#include <ditrl/dist/reduction.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/advantages.hpp>
#include <ditrl/rl/ema.hpp>
#include <ditrl/rl/grpo_loss.hpp>
#include <ditrl/rl/loss_window.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/sft_loss.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

using namespace ditrl::rl;

namespace {

at::Tensor f32(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

}  // namespace

TEST_CASE("grpo loss: ratio 1 gives -mean(advantage)", "[rl][loss]") {
  const at::Tensor lp = f32({-1.2f, -0.7f, -3.0f, 0.4f}).set_requires_grad(true);
  const at::Tensor adv = f32({0.5f, -1.5f, 2.0f, 0.25f});
  const GrpoTerms t = grpo_loss(lp, lp.detach(), adv, GrpoOptions{});
  CHECK(t.loss_sum.item<double>() / 4 == Approx(-adv.mean().item<double>()).epsilon(1e-7));
  CHECK(at::equal(t.ratio, at::ones({4})));
  CHECK(t.kl.abs().sum().item<double>() == 0);
  // d(loss_sum)/d(logp_new) = -A at ratio 1 (inside the clip range)
  t.loss_sum.backward();
  CHECK(at::allclose(lp.grad(), -adv));
}

TEST_CASE("grpo loss: clipping at both boundaries", "[rl][loss]") {
  const double eps = 0.2;
  const GrpoOptions o{eps, 5.0, 0.0};
  // ratios e^0.5 (> 1 + eps) and e^-0.5 (< 1 - eps), each with a positive and a negative advantage
  const at::Tensor lp_new = f32({0.5f, 0.5f, -0.5f, -0.5f}).set_requires_grad(true);
  const at::Tensor lp_old = at::zeros({4});
  const at::Tensor adv = f32({1.0f, -1.0f, 1.0f, -1.0f});
  const GrpoTerms t = grpo_loss(lp_new, lp_old, adv, o);
  const double hi = std::exp(0.5), lo = std::exp(-0.5);
  // A > 0, ratio above: the clipped -A(1 + eps) is the max (no gradient); A < 0 above: unclipped |A| ratio.
  CHECK(t.policy_loss[0].item<double>() == Approx(-(1 + eps)));
  CHECK(t.policy_loss[1].item<double>() == Approx(hi));
  // A > 0, ratio below: unclipped -ratio; A < 0 below: clipped |A|(1 - eps) (no gradient).
  CHECK(t.policy_loss[2].item<double>() == Approx(-lo));
  CHECK(t.policy_loss[3].item<double>() == Approx(1 - eps));
  t.loss_sum.backward();
  CHECK(lp_new.grad()[0].item<double>() == 0);
  CHECK(lp_new.grad()[1].item<double>() == Approx(hi));
  CHECK(lp_new.grad()[2].item<double>() == Approx(-lo));
  CHECK(lp_new.grad()[3].item<double>() == 0);
}

TEST_CASE("grpo loss: advantages are clamped to adv_clip_max", "[rl][loss]") {
  const at::Tensor lp = at::zeros({2});
  const GrpoTerms t = grpo_loss(lp, lp, f32({12.0f, -7.0f}), GrpoOptions{1e-4, 5.0, 0.0});
  CHECK(at::equal(t.advantages, f32({5.0f, -5.0f})));
  CHECK(t.loss_sum.item<double>() == 0.0);
}

TEST_CASE("grpo KL: zero when the reference equals the policy and d^2 / (2 std^2) otherwise", "[rl][loss]") {
  const at::Tensor mean = at::randn({2, 3, 4, 4}, at::kFloat);
  const at::Tensor std_dev_t = f32({0.5f, 2.0f}).view({2, 1, 1, 1});
  const at::Tensor lp = at::zeros({2});
  const GrpoOptions o{1e-4, 5.0, 0.04};
  KlInputs same{mean, mean.clone(), std_dev_t};
  const GrpoTerms t0 = grpo_loss(lp, lp, f32({1.0f, -1.0f}), o, &same);
  CHECK(t0.kl.abs().sum().item<double>() == 0);
  CHECK(t0.loss_sum.item<double>() == 0);
  KlInputs shifted{mean + 0.3, mean, std_dev_t};
  const at::Tensor kl = grpo_kl(shifted);
  CHECK(kl[0].item<double>() == Approx(0.09 / (2 * 0.25)).epsilon(1e-5));
  CHECK(kl[1].item<double>() == Approx(0.09 / (2 * 4.0)).epsilon(1e-5));
  const GrpoTerms t1 = grpo_loss(lp, lp, f32({0.0f, 0.0f}), o, &shifted);
  CHECK(t1.loss_sum.item<double>() == Approx(0.04 * kl.sum().item<double>()));
  // a broadcast std_dev_t (one timestep for the batch) works too
  KlInputs one{mean + 0.3, mean, f32({0.5f}).view({1, 1, 1, 1})};
  CHECK(grpo_kl(one)[1].item<double>() == Approx(0.09 / 0.5).epsilon(1e-5));
  CHECK_THROWS_WITH(grpo_loss(lp, lp, f32({0.0f, 0.0f}), o), Catch::Contains("reference forward"));
}

TEST_CASE("nft loss: small hand-computed case", "[rl][loss]") {
  // B = 2 pairs of 3 elements, computed here in double from the formula of §4.3.
  const std::vector<std::vector<double>> v = {{0.4, -1.0, 2.0}, {0.1, 0.3, -0.2}};
  const std::vector<std::vector<double>> v_old = {{0.5, -0.5, 1.0}, {0.0, 0.6, -0.4}};
  const std::vector<std::vector<double>> x0 = {{0.2, 0.1, -0.3}, {1.0, -1.0, 0.5}};
  const std::vector<std::vector<double>> xt = {{0.6, -0.4, 0.9}, {0.7, -0.2, 0.1}};
  const std::vector<double> sigma = {0.7, 0.25};
  const std::vector<double> adv = {1.5, -7.0};
  const double beta = 0.5, clip = 5.0;
  auto to_tensor = [](const std::vector<std::vector<double>>& a) {
    return at::tensor(std::vector<double>{a[0][0], a[0][1], a[0][2], a[1][0], a[1][1], a[1][2]}, at::kDouble)
        .view({2, 3})
        .to(at::kFloat);
  };
  for (bool adaptive : {false, true}) {
    INFO("adaptive " << adaptive);
    std::vector<double> expected(2);
    for (int b = 0; b < 2; ++b) {
      const double r = std::clamp(std::clamp(adv[b], -clip, clip) / clip / 2 + 0.5, 0.0, 1.0);
      double pos = 0, neg = 0, wpos = 0, wneg = 0;
      std::vector<double> ep(3), en(3);
      for (int e = 0; e < 3; ++e) {
        const double vp = beta * v[b][e] + (1 - beta) * v_old[b][e];
        const double vn = (1 + beta) * v_old[b][e] - beta * v[b][e];
        ep[e] = xt[b][e] - sigma[b] * vp - x0[b][e];
        en[e] = xt[b][e] - sigma[b] * vn - x0[b][e];
        wpos += std::abs(ep[e]) / 3;
        wneg += std::abs(en[e]) / 3;
      }
      for (int e = 0; e < 3; ++e) {
        pos += ep[e] * ep[e] / 3 / (adaptive ? std::max(wpos, 1e-5) : 1.0);
        neg += en[e] * en[e] / 3 / (adaptive ? std::max(wneg, 1e-5) : 1.0);
      }
      expected[b] = (r * pos / beta + (1 - r) * neg / beta) * clip;
    }
    const NftTerms t = nft_loss(to_tensor(v), to_tensor(v_old), to_tensor(x0), to_tensor(xt),
                                at::tensor(sigma, at::kDouble).to(at::kFloat),
                                at::tensor(adv, at::kDouble).to(at::kFloat), NftOptions{beta, clip, adaptive, 0.0});
    CHECK(t.per_pair[0].item<double>() == Approx(expected[0]).epsilon(1e-6));
    CHECK(t.per_pair[1].item<double>() == Approx(expected[1]).epsilon(1e-6));
    CHECK(t.loss_sum.item<double>() == Approx(expected[0] + expected[1]).epsilon(1e-6));
    CHECK(t.r[0].item<double>() == Approx(0.65));
    CHECK(t.r[1].item<double>() == 0.0);
  }
}

TEST_CASE("nft loss: beta 1 with v == v_old pulls x0 toward the target / reward weights", "[rl][loss]") {
  const at::Tensor x0 = at::randn({2, 4, 3, 3});
  const at::Tensor eps = at::randn({2, 4, 3, 3});
  const at::Tensor sigmas = f32({0.3f, 0.9f});
  const at::Tensor xt = corrupt(x0, sigmas, eps);
  CHECK(at::allclose(xt[1], 0.1 * x0[1] + 0.9 * eps[1], 1e-6, 1e-6));
  const at::Tensor v_true = (eps - x0).set_requires_grad(true);  // the exact velocity: x0_pos == x0
  const NftTerms t = nft_loss(v_true, v_true.detach(), x0, xt, sigmas, f32({5.0f, 5.0f}), NftOptions{});
  CHECK(t.loss_sum.item<double>() == Approx(0).margin(1e-8));
  CHECK(at::equal(nft_reward_weight(f32({-10.0f, 0.0f, 2.5f, 10.0f}), 5.0), f32({0.0f, 0.5f, 0.75f, 1.0f})));
  CHECK_THROWS_WITH(nft_loss(v_true, v_true, x0, xt, sigmas, f32({1.0f, 1.0f}), NftOptions{1.0, 5.0, true, 0.1}),
                    Catch::Contains("reference velocity"));
}

TEST_CASE("sft loss: velocity MSE against eps - x0", "[rl][loss]") {
  const at::Tensor x0 = at::randn({3, 2, 4});
  const at::Tensor eps = at::randn({3, 2, 4});
  CHECK(sft_loss(eps - x0, x0, eps).loss_sum.item<double>() == Approx(0).margin(1e-12));
  const at::Tensor offset = f32({1.0f, 2.0f, -0.5f}).view({3, 1, 1});
  const SftTerms t = sft_loss((eps - x0 + offset).to(at::kBFloat16).to(at::kFloat), x0, eps);
  // bf16 rounding of the velocity aside, each pair's loss is offset^2
  CHECK(t.per_pair[0].item<double>() == Approx(1.0).epsilon(0.05));
  CHECK(t.per_pair[1].item<double>() == Approx(4.0).epsilon(0.05));
  CHECK(t.per_pair[2].item<double>() == Approx(0.25).epsilon(0.1));
  const SftTerms exact = sft_loss(eps - x0 + offset, x0, eps);
  CHECK(exact.loss_sum.item<double>() == Approx(5.25).epsilon(1e-5));
}

TEST_CASE("loss aggregation: micro-batch sums over the window's pairs give the window mean", "[rl][loss]") {
  // 12 pairs in 4 chunks of 3 (one micro-batch each), 2 windows: window w trains chunks w and w + 2.
  const auto windows = optimizer_windows({12, 3, 3, 2, 0, 1});
  REQUIRE(windows.size() == 2);
  CHECK(windows[1].pairs() == 6);
  CHECK(windows[1].leaves == 2);
  REQUIRE(windows[0].micro_batches.size() == 2);
  CHECK(windows[0].micro_batches[0].begin == 0);
  CHECK(windows[0].micro_batches[1].begin == 6);
  CHECK(windows[0].micro_batches[1].end == 9);
  CHECK(windows[1].micro_batches[0].begin == 3);

  // Accumulating backward(window_objective(sum over micro-batch)) equals backward(mean over the window).
  const at::Tensor w = at::randn({5}).set_requires_grad(true);
  const at::Tensor data = at::randn({12, 5});
  auto pair_loss = [&](int64_t b, int64_t e) { return (data.narrow(0, b, e - b).matmul(w)).pow(2); };
  for (const auto& mb : windows[0].micro_batches)
    window_objective(pair_loss(mb.begin, mb.end).sum(), windows[0].pairs()).backward();
  const at::Tensor accumulated = w.grad().clone();
  w.grad().zero_();
  at::cat({pair_loss(0, 3), pair_loss(6, 9)}).mean().backward();
  CHECK(at::allclose(accumulated, w.grad(), 1e-5, 1e-6));

  CHECK_THROWS_WITH(optimizer_windows({10, 5, 5, 3, 0, 1}), Catch::Contains("equal optimizer steps"));
  CHECK_THROWS_WITH(optimizer_windows({12, 6, 4, 2, 0, 1}), Catch::Contains("no ragged final micro-batch"));
  CHECK_THROWS_WITH(optimizer_windows({12, 5, 5, 1, 0, 1}), Catch::Contains("not whole chunks"));
  CHECK_THROWS_WITH(window_objective(at::ones({}), 0), Catch::Contains("0 pairs"));
  CHECK(chunk_samples(3, 2) == 2);
  CHECK(chunk_samples(4, 2) == 1);
  CHECK(chunk_samples(1, 4) == 4);
}

namespace {

// Each rank's windows of a rollout of `samples` samples in chunks of
// `chunk` samples with `per_chunk` micro-batches each, at `ranks` ranks.
std::vector<std::vector<OptimizerWindow>> layout_at(int ranks, int64_t samples, int64_t chunk, int64_t per_chunk,
                                                    int64_t windows) {
  std::vector<std::vector<OptimizerWindow>> out;
  const int64_t chunk_pairs = chunk * per_chunk;
  for (int r = 0; r < ranks; ++r)
    out.push_back(optimizer_windows({samples / ranks * per_chunk, chunk_pairs, chunk, windows, r, ranks}));
  return out;
}

// The global (chunk, micro-batch) a rank's micro-batch trains.
std::pair<int64_t, int64_t> global_of(const MicroBatch& mb, int rank, int ranks, int64_t samples, int64_t chunk,
                                      int64_t per_chunk) {
  const int64_t rank_chunks = samples / chunk / ranks;
  const int64_t local_chunk = mb.begin / (chunk * per_chunk);
  return {rank * rank_chunks + local_chunk, mb.index};
}

}  // namespace

TEST_CASE("loss aggregation: the canonical order is the same tree at 1 2 4 and 8 ranks", "[rl][loss]") {
  // 24 chunks (q = 3, 2^3) of 5 micro-batches, 1 window; and 16 chunks in 2 windows.
  for (const auto& [samples, windows] : {std::pair<int64_t, int64_t>{48, 1}, {32, 2}}) {
    const int64_t chunk = 2, per_chunk = 5;
    // The leaf of every global (chunk, micro-batch) at one rank.
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> leaf_at_one;  // -> (window, leaf)
    const auto one = layout_at(1, samples, chunk, per_chunk, windows);
    for (size_t w = 0; w < one[0].size(); ++w)
      for (const MicroBatch& mb : one[0][w].micro_batches)
        leaf_at_one[global_of(mb, 0, 1, samples, chunk, per_chunk)] = {static_cast<int64_t>(w), mb.leaf};
    REQUIRE(leaf_at_one.size() == static_cast<size_t>(samples / chunk * per_chunk));

    for (int ranks : {2, 4, 8}) {
      const auto all = layout_at(ranks, samples, chunk, per_chunk, windows);
      const std::vector<int> order = ditrl::dist::chunk_leaf_order(ranks);
      for (size_t w = 0; w < all[0].size(); ++w) {
        const size_t steps = all[0][w].micro_batches.size();
        for (size_t j = 0; j < steps; ++j) {
          // Local step j of every rank: one aligned block of `ranks` leaves,
          // rank order[p] at position p, each the leaf one rank gives it.
          const int64_t block = all[order[0]][w].micro_batches[j].leaf;
          CHECK(block % ranks == 0);
          for (int p = 0; p < ranks; ++p) {
            const int r = order[static_cast<size_t>(p)];
            const MicroBatch& mb = all[static_cast<size_t>(r)][w].micro_batches.at(j);
            CHECK(mb.leaf == block + p);
            CHECK(mb.index == all[0][w].micro_batches[j].index);  // the ranks run the same step (expert)
            CHECK(leaf_at_one.at(global_of(mb, r, ranks, samples, chunk, per_chunk)) ==
                  std::pair<int64_t, int64_t>{static_cast<int64_t>(w), mb.leaf});
          }
        }
      }
    }
  }
}

TEST_CASE("advantages: per-group and global statistics with either std convention", "[rl][advantages]") {
  const at::Tensor r = f32({1.0f, 2.0f, 3.0f, 4.0f, 0.0f, 0.0f, 0.0f, 8.0f});
  AdvantageOptions o;
  o.group_size = 4;
  // group 0: mean 2.5, population std sqrt(1.25); group 1: mean 2, population std sqrt(12)
  at::Tensor a = group_advantages(r, o);
  CHECK(a[0].item<double>() == Approx(-1.5 / (std::sqrt(1.25) + 1e-4)));
  CHECK(a[7].item<double>() == Approx(6.0 / (std::sqrt(12.0) + 1e-4)));
  o.std_ddof = 1;  // torch.std: N - 1
  a = group_advantages(r, o);
  CHECK(a[0].item<double>() == Approx(-1.5 / (std::sqrt(5.0 / 3.0) + 1e-4)));
  o.std_ddof = 0;
  o.global_std = true;  // std of all raw rewards
  const double mean_all = 18.0 / 8, var_all = (1 + 4 + 9 + 16 + 64) / 8.0 - mean_all * mean_all;
  a = group_advantages(r, o);
  CHECK(a[1].item<double>() == Approx(-0.5 / (std::sqrt(var_all) + 1e-4)));
  o.global_mean = true;
  a = group_advantages(r, o);
  CHECK(a[7].item<double>() == Approx((8.0 - mean_all) / (std::sqrt(var_all) + 1e-4)));
  o.std_normalization = false;
  CHECK(group_advantages(r, o)[7].item<double>() == Approx(8.0 - mean_all));
  // identical rewards: zero advantage, not a division by zero
  o = AdvantageOptions{};
  o.group_size = 2;
  CHECK(group_advantages(f32({3.0f, 3.0f}), o).abs().sum().item<double>() == 0);
  // G == 1: std normalisation is forced off, the advantage is R - R = 0 per group
  o.group_size = 1;
  CHECK(group_advantages(f32({3.0f, -1.0f}), o).abs().sum().item<double>() == 0);
  o.group_size = 3;
  CHECK_THROWS_WITH(group_advantages(r, o), Catch::Contains("groups of 3"));
  o.group_size = 2;
  CHECK_THROWS_WITH(group_advantages(f32({1.0f, NAN}), o), Catch::Contains("sample 1 is not finite"));
}

TEST_CASE("ema: decay schedule / update and swap", "[rl][ema]") {
  at::Tensor p = f32({1.0f, 2.0f});
  EmaShadow ema({p}, EmaOptions{0.001, 0.1, 0.5, 2});
  CHECK(ema.decay_at(1) == 0.001);
  CHECK(ema.decay_at(2) == 0.001);
  CHECK(ema.decay_at(3) == Approx(0.1));
  CHECK(ema.decay_at(100) == 0.5);
  p.copy_(f32({3.0f, 4.0f}));  // an optimizer step
  CHECK(ema.update() == 0.001);
  CHECK(ema.shadow()[0][0].item<double>() == Approx(0.001 * 1.0 + 0.999 * 3.0));
  ema.swap();
  CHECK(p[0].item<double>() == Approx(0.001 * 1.0 + 0.999 * 3.0));
  CHECK_THROWS_WITH(ema.update(), Catch::Contains("swapped in"));
  ema.swap();
  CHECK(p[0].item<float>() == 3.0f);
}
