#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/plan_report.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <catch2/catch.hpp>

#include "block_stack.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

struct Planned {
  std::unique_ptr<test::BlockStack> model = std::make_unique<test::BlockStack>(test::StackShape{}, 1);
  precision::CompiledPlan plan =
      precision::PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {{"*.norm2.*", at::kFloat, "norm2 rule", true}})
          .compile(test::parameter_names(*model));
};

}  // namespace

TEST_CASE("plan report: every parameter with its unit / range / dtypes and rule / totals per rank", "[shard][plan]") {
  Planned p;
  p.model->blocks->ptr<test::BlockImpl>(2)->fc2->weight.requires_grad_(false);
  const int world = 4;
  int64_t owned_everywhere = 0;
  for (int rank = 0; rank < world; ++rank) {
    const shard::PlanReport report = shard::plan_report(*p.model, p.model->wrap_units(), p.plan, world, rank);
    REQUIRE(report.rows.size() == 3 * 8 + 4);
    for (const shard::PlanRow& row : report.rows) owned_everywhere += row.end - row.begin;
    CHECK(report.parameters == 3 * 200 + (5 * 7 + 7) + (7 * 3 + 3));
    CHECK(report.trainable == report.parameters - 7 * 11);
    // The per-rank budget is the layout's formula.
    const shard::Layout layout = shard::build_layout(*p.model, p.model->wrap_units(), p.plan, world);
    CHECK(report.per_rank.total() == layout.memory().total());
    int64_t row_bytes = 0;
    for (const shard::PlanRow& row : report.rows) row_bytes += row.bytes;
    CHECK(row_bytes <= report.per_rank.total() - report.per_rank.peak_gathered);
  }
  CHECK(owned_everywhere == 3 * 200 + 42 + 24);  // the ranks' ranges partition every parameter

  const shard::PlanReport report = shard::plan_report(*p.model, p.model->wrap_units(), p.plan, world, 1);
  const shard::PlanRow& norm2 = report.rows[6];
  CHECK(norm2.name == "blocks.0.norm2.weight");
  CHECK(norm2.unit == "blocks.0");
  CHECK(norm2.compute == "fp32");
  CHECK(norm2.rule == "norm2 rule");
  CHECK(report.rows[0].name == "blocks.0.norm1.weight");
  CHECK(report.rows[0].compute == "bf16");
  CHECK(report.rows[0].rule == "default");
  CHECK(report.rows.back().unit == "(root)");
  // blocks.0's bf16 group holds 186 elements, 47 per rank: rank 1 owns
  // [47, 94) of it, i.e. fc1.weight's elements [33, 77) and fc1.bias [0, 3).
  CHECK(report.rows[2].name == "blocks.0.fc1.weight");
  CHECK(report.rows[2].begin == 47 - 14);
  CHECK(report.rows[2].end == 77);
  CHECK(report.rows[3].begin == 0);
  CHECK(report.rows[3].end == 94 - 91);
  CHECK(report.rows[2].bytes == (77 - 33) * (4 + 12 + 2));

  const std::string table = report.table();
  CHECK_THAT(table, Contains("parameter"));
  CHECK_THAT(table, Contains("rank 1 range"));
  CHECK_THAT(table, Contains("blocks.2.fc2.weight (frozen)"));
  CHECK_THAT(table, Contains("norm2 rule"));
  CHECK_THAT(table, Contains("peak gathered"));
  CHECK_THAT(table, Contains("total over 4 ranks"));
}

// The block stack's parameter tree with shapes only, as a family builds it
// with meta = true.
struct MetaModule : torch::nn::Module {
  std::shared_ptr<MetaModule> add(const std::string& name) {
    return register_module(name, std::make_shared<MetaModule>());
  }
  void param(const std::string& name, std::vector<int64_t> shape) {
    register_parameter(name, torch::empty(shape, torch::TensorOptions().device(torch::kMeta)));
  }
  void linear(const std::string& name, int64_t in, int64_t out) {
    auto m = add(name);
    m->param("weight", {out, in});
    m->param("bias", {out});
  }
  void norm(const std::string& name, int64_t dim) {
    auto m = add(name);
    m->param("weight", {dim});
    m->param("bias", {dim});
  }
};

TEST_CASE("plan report: works on a model whose parameters are on the meta device", "[shard][plan]") {
  const test::StackShape s;
  auto model = std::make_shared<MetaModule>();
  model->linear("embed", s.in, s.dim);
  auto blocks = model->add("blocks");
  std::vector<models::WrapUnit> units;
  for (int64_t b = 0; b < s.blocks; ++b) {
    auto block = blocks->add(std::to_string(b));
    block->norm("norm1", s.dim);
    block->linear("fc1", s.dim, s.hidden);
    block->linear("fc2", s.hidden, s.dim);
    block->norm("norm2", s.dim);
    units.push_back({"blocks." + std::to_string(b), block});
  }
  model->linear("head", s.dim, s.out);
  const auto plan =
      precision::PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {{"*.norm2.*", at::kFloat, "r", true}})
          .compile(test::parameter_names(*model));
  const shard::PlanReport report = shard::plan_report(*model, units, plan, 2, 0);
  CHECK(report.rows.size() == 28);
  CHECK(report.rows[0].name == "blocks.0.norm1.weight");
  CHECK(report.parameters == 3 * (2 * 7 + 2 * 7 + 7 * 11 + 11 + 11 * 7 + 7) + 42 + 24);
  CHECK(report.per_rank.masters > 0);
}

TEST_CASE("shard options: from the deck's [parallel] and [train] sections", "[shard]") {
  const config::Config config = config::parse_deck(R"(
[model]
family = "sd3"
[parallel]
prefetch = false
reshard_after_forward = false
[train]
betas = [0.8, 0.95]
eps = 1e-6
weight_decay = 0.01
)",
                                                   "deck.toml");
  const shard::ShardOptions options = ditrl::app::shard_options(config, at::kCPU);
  CHECK_FALSE(options.prefetch);
  CHECK_FALSE(options.reshard_after_forward);
  CHECK(options.adamw.beta1 == 0.8);
  CHECK(options.adamw.beta2 == 0.95);
  CHECK(options.adamw.eps == 1e-6);
  CHECK(options.adamw.weight_decay == 0.01);
  CHECK(options.device == at::Device(at::kCPU));
}
