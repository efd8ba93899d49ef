#include <ditrl/error.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/numpy_random.hpp>
#include <ditrl/rl/stable_hash.hpp>
#include <ditrl/rl/step_strategy.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>
#include <rl_reference_values.hpp>

#include <algorithm>

using namespace ditrl::rl;

TEST_CASE("numpy rng: default_rng(seed) bit generator and integers match NumPy", "[rl][strategy]") {
  for (const auto& ref : ditrl::test::numpy_rng_references()) {
    INFO("seed " << ref.seed);
    NumpyGenerator raw(ref.seed);
    for (uint64_t expected : ref.uint64s) CHECK(raw.next_uint64() == expected);
    NumpyGenerator rng(ref.seed);
    for (int64_t expected : ref.integers) CHECK(rng.integers(ref.low, ref.high) == expected);
  }
  NumpyGenerator rng(1);
  CHECK_THROWS_WITH(rng.integers(3, 3), Catch::Contains("greater than low"));
}

TEST_CASE("torch randperm from a seeded CPU generator matches Python torch", "[rl][strategy]") {
  for (const auto& ref : ditrl::test::randperm_references()) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(ref.seed);
    const at::Tensor perm = at::randperm(ref.n, gen, at::kLong);
    CHECK(std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + ref.n) == ref.perm);
  }
}

TEST_CASE("sde_window: the reference's window for a seed / with the pair latents", "[rl][strategy]") {
  for (const auto& ref : ditrl::test::sde_window_references()) {
    INFO("seed " << ref.seed << " window " << ref.window << " in [" << ref.lo << ", " << ref.hi << ")");
    const StepSelection s = sde_window(ref.steps, ref.window, ref.lo, ref.hi, ref.seed);
    REQUIRE(static_cast<int64_t>(s.sde_steps.size()) == ref.window);
    CHECK(s.sde_steps.front() == ref.start);
    CHECK(s.sde_steps.back() == ref.start + ref.window - 1);
    CHECK(s.return_latents.front() == ref.start);
    CHECK(s.return_latents.back() == ref.start + ref.window);
    CHECK(static_cast<int64_t>(s.return_latents.size()) == ref.window + 1);
  }
  StepStrategyOptions o;
  o.num_steps = 10;
  o.sde_steps = 2;
  const StepSelection a = select_steps(o, SampleKey{77, 0});
  CHECK(select_steps(o, SampleKey{77, 5}).sde_steps == a.sde_steps);  // reproducible per seed
  o.window = {4, 6};
  CHECK(select_steps(o, SampleKey{77, 0}).sde_steps == std::vector<int64_t>{4, 5});
  CHECK_THROWS_WITH(sde_window(10, 3, 0, 2, 1), Catch::Contains("exceeds the range"));
  CHECK_THROWS_WITH(sde_window(10, 1, 0, 11, 1), Catch::Contains("0 <= lo < hi <= steps (10)"));
  CHECK_THROWS_WITH(sde_window(10, 0, 0, 10, 1), Catch::Contains(">= 1"));
}

TEST_CASE("epoch_global_random_choice: documented sets per epoch / shared within an epoch", "[rl][strategy]") {
  // rollout_seed 42, candidates 0..9, 3 steps: epoch e draws randperm(10) from a CPU generator seeded 42 + e.
  const std::vector<int64_t> candidates = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  StepStrategyOptions o;
  o.strategy = StepStrategy::EpochGlobalRandomChoice;
  o.num_steps = 10;
  o.sde_steps = 3;
  o.candidate_steps = candidates;
  o.rollout_seed = 42;
  o.rollout_batch_size = 4;
  const auto& perms = ditrl::test::randperm_references();  // seeds 42, 43, 44 with n = 10
  std::vector<std::vector<int64_t>> per_epoch;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> expected(perms[epoch].perm.begin(), perms[epoch].perm.begin() + 3);
    std::sort(expected.begin(), expected.end());
    INFO("epoch " << epoch);
    for (int64_t group = epoch * 4; group < epoch * 4 + 4; ++group)
      CHECK(select_steps(o, SampleKey{static_cast<uint64_t>(group) * 1000, group}).sde_steps == expected);
    per_epoch.push_back(expected);
  }
  CHECK(per_epoch[0] != per_epoch[1]);
  CHECK(per_epoch[1] != per_epoch[2]);
  // the candidates are indexed by the permutation, not the permutation itself
  const StepSelection odd = epoch_global_random_choice(20, {1, 3, 5, 7, 9, 11, 13, 15, 17, 19}, 3, 0, 42);
  for (size_t i = 0; i < 3; ++i) CHECK(odd.sde_steps[i] == 2 * per_epoch[0][i] + 1);
  CHECK(epoch_global_random_choice(10, {7, 2, 5}, 3, 9, 1).sde_steps == std::vector<int64_t>{2, 5, 7});
  CHECK(epoch_global_random_choice(10, {7, 2, 5}, 3, 9, 1).return_latents == std::vector<int64_t>{2, 3, 5, 6, 7, 8});
  CHECK_THROWS_WITH(epoch_global_random_choice(10, {}, 1, 0, 0), Catch::Contains("candidate_steps is required"));
  CHECK_THROWS_WITH(epoch_global_random_choice(10, {3, 3}, 1, 0, 0), Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(epoch_global_random_choice(10, {10}, 1, 0, 0), Catch::Contains("outside [0, 10)"));
}

TEST_CASE("ode_and_return_last and NFT sigma selection", "[rl][strategy]") {
  const StepSelection s = ode_and_return_last(10);
  CHECK(s.sde_steps.empty());
  CHECK(s.return_latents == std::vector<int64_t>{10});
  StepStrategyOptions o;
  o.strategy = StepStrategy::OdeAndReturnLast;
  CHECK(select_steps(o, {}).return_latents == std::vector<int64_t>{10});

  // a 9-step snapshot has 9 non-terminal sigmas; fraction 0.99 -> K = int(8.91) = 8
  const auto& ref = ditrl::test::randperm_references()[4];  // seeded with stable_hash("nft_sigma_shuffle", 42, 3)
  REQUIRE(ref.seed == stable_hash("nft_sigma_shuffle", 42, 3));
  const auto shuffled = nft_sigma_indices(9, 0.99, true, 42, 3);
  CHECK(shuffled == std::vector<int64_t>(ref.perm.begin(), ref.perm.begin() + 8));
  CHECK(nft_sigma_indices(10, 0.99, false, 42, 3) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(nft_sigma_indices(10, 0.01, true, 42, 3).size() == 1);
  CHECK(nft_sigma_indices(9, 0.99, true, 42, 4) != shuffled);
}
