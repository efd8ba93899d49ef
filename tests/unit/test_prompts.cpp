#include <ditrl/error.hpp>
#include <ditrl/rollout/prompts.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <set>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

std::vector<models::CondSpec> spec() {
  return {{"encoder_hidden_states", {5, 8}, at::kFloat},
          {"pooled_projections", {6}, at::kFloat},
          {"encoder_hidden_states_mask", {5}, at::kLong}};
}

models::Cond make_cond(int64_t n) {
  models::Cond c;
  c.tensors["encoder_hidden_states"] = at::arange(n * 40, at::kFloat).reshape({n, 5, 8});
  c.tensors["pooled_projections"] = at::arange(n * 6, at::kFloat).reshape({n, 6}).neg();
  c.tensors["encoder_hidden_states_mask"] = at::ones({n, 5}, at::kLong);
  return c;
}

}  // namespace

TEST_CASE("prompts: a dataset round-trips row by row / with its negative prompt", "[prompts]") {
  const std::string dir = test::fresh_output_dir("prompts_dataset");
  models::Cond negative;
  negative.tensors["pooled_projections"] = at::full({1, 6}, 0.5f);
  rollout::write_prompt_dataset(dir + "/p.h5", {"a cat", "a dog", "a cow"}, make_cond(3), negative,
                                {{"encoder", "test"}});
  auto prompts = rollout::open_prompt_dataset(dir + "/p.h5", spec());
  CHECK(prompts->size() == 3);
  CHECK(prompts->text(1) == "a dog");
  const models::Cond rows = prompts->fetch({2, 0});
  const models::Cond all = make_cond(3);
  CHECK(at::equal(rows.tensors.at("encoder_hidden_states"),
                  all.tensors.at("encoder_hidden_states").index_select(0, at::tensor({2, 0}))));
  CHECK(at::equal(rows.tensors.at("pooled_projections")[0], all.tensors.at("pooled_projections")[2]));
  const models::Cond neg = prompts->negative(2);
  CHECK(at::equal(neg.tensors.at("pooled_projections"), at::full({2, 6}, 0.5f)));
  CHECK(at::equal(neg.tensors.at("encoder_hidden_states"), at::zeros({2, 5, 8})));
  CHECK(at::equal(neg.tensors.at("encoder_hidden_states_mask"), at::ones({2, 5}, at::kLong)));
  CHECK_THROWS_WITH(prompts->fetch({3}), Contains("prompt index 3 outside [0, 3)"));
}

TEST_CASE("prompts: a dataset that does not fit the family is rejected naming every tensor", "[prompts]") {
  const std::string dir = test::fresh_output_dir("prompts_bad");
  models::Cond cond = make_cond(2);
  cond.tensors.erase("pooled_projections");
  cond.tensors["encoder_hidden_states"] = at::zeros({2, 4, 8});
  rollout::write_prompt_dataset(dir + "/p.h5", {"x", "y"}, cond, {}, {});
  try {
    rollout::open_prompt_dataset(dir + "/p.h5", spec());
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains(dir + "/p.h5"));
    CHECK_THAT(what, Contains("missing /cond/pooled_projections (fp32, per-prompt shape [6])"));
    CHECK_THAT(what, Contains("/cond/encoder_hidden_states is fp32 [2, 4, 8], the family needs fp32 [2, 5, 8]"));
  }
  CHECK_THROWS_WITH(rollout::open_prompt_dataset(dir + "/absent.h5", spec()), Contains("absent.h5"));
}

TEST_CASE("prompts: synthetic prompts are seeded per prompt / independent of batching", "[prompts]") {
  auto a = rollout::synthetic_prompts(spec(), 10, 3);
  auto b = rollout::synthetic_prompts(spec(), 10, 3);
  auto c = rollout::synthetic_prompts(spec(), 10, 4);
  const models::Cond batch = a->fetch({7, 1, 4});
  CHECK(at::equal(batch.tensors.at("encoder_hidden_states")[1], b->fetch({1}).tensors.at("encoder_hidden_states")[0]));
  CHECK_FALSE(at::equal(batch.tensors.at("pooled_projections"), c->fetch({7, 1, 4}).tensors.at("pooled_projections")));
  CHECK(at::equal(batch.tensors.at("encoder_hidden_states_mask"), at::ones({3, 5}, at::kLong)));
  CHECK(a->text(4) == "synthetic prompt 4");
}

TEST_CASE("prompts: conditioning keeps host copies of its masks through the row selections", "[prompts]") {
  // A family decides from a mask's host copy whether the mask masks anything,
  // so its forward reads no device value for it.
  const std::string mask = "encoder_hidden_states_mask";
  models::Cond cond;
  cond.tensors["encoder_hidden_states"] = at::randn({3, 2, 4});
  cond.tensors[mask] = at::tensor({1, 1, 1, 0, 1, 1}, at::kLong).view({3, 2});
  CHECK(at::equal(cond.on_host(mask), cond.at(mask)));  // no copy: the tensor itself
  const models::Cond moved = cond.to(c10::kCPU);
  REQUIRE(moved.host.size() == 1);
  CHECK(moved.on_host(mask).device().is_cpu());
  CHECK(at::equal(moved.on_host(mask), cond.at(mask)));
  const models::Cond rows = moved.index_select(at::tensor({2, 1}, at::kLong)).narrow(1, 1);
  CHECK(at::equal(rows.on_host(mask), at::tensor({1, 0}, at::kLong).view({1, 2})));
  CHECK(at::equal(rows.at("encoder_hidden_states"), cond.at("encoder_hidden_states").narrow(0, 1, 1)));
  const models::Cond joint = models::Cond::cat(rows, moved.narrow(0, 1));
  CHECK(at::equal(joint.on_host(mask), at::tensor({1, 0, 1, 1}, at::kLong).view({2, 2})));
  CHECK(models::Cond::cat(rows, cond.narrow(0, 1)).host.empty());  // one half without a copy: none
  CHECK_THROWS_WITH(models::Cond::cat(cond, models::Cond{}), Contains("'encoder_hidden_states' is missing"));
}

TEST_CASE("prompts: rollout order walks seeded per-epoch permutations", "[prompts]") {
  const int64_t n = 7, batch = 3;
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < 7; ++r) {  // 21 positions = 3 epochs
    const auto ids = rollout::rollout_prompts(n, 5, r, batch);
    CHECK(ids == rollout::rollout_prompts(n, 5, r, batch));
    seen.insert(seen.end(), ids.begin(), ids.end());
  }
  for (int epoch = 0; epoch < 3; ++epoch) {
    const std::set<int64_t> one(seen.begin() + epoch * n, seen.begin() + (epoch + 1) * n);
    CHECK(one.size() == static_cast<size_t>(n));  // every prompt once per epoch
  }
  CHECK(std::vector<int64_t>(seen.begin(), seen.begin() + n) !=
        std::vector<int64_t>(seen.begin() + n, seen.begin() + 2 * n));
  CHECK(rollout::rollout_prompts(n, 6, 0, batch) != rollout::rollout_prompts(n, 5, 0, batch));
}
