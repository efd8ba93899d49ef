#include <ditrl/app/memory_check.hpp>
#include <ditrl/app/memory_plan.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/plan_report.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <catch2/catch.hpp>

#include <algorithm>

#include <unistd.h>

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

TEST_CASE("activation memory: the forward and training estimates are their closed forms", "[plan][memory]") {
  // Joint attention (SD3-like): T = 64 image + 16 text tokens through every block.
  models::ActivationGeometry g;
  g.tokens = 64;
  g.text_tokens = 16;
  g.dim = 32;
  g.heads = 4;
  g.ffn_dim = 128;
  g.blocks = 3;
  g.joint = true;
  models::ActivationOptions o;
  o.batch = 2;
  o.element_bytes = 2;  // bf16: the math backend adds fp32 copies of q, k, v and of its output (4 x 4 B per D)
  const int64_t t = 80, rows = o.batch * t;
  const models::ActivationEstimate f = models::estimate_forward(g, o);
  CHECK(f.saved_inputs == 0);
  CHECK(f.block == rows * g.dim * (10 * 2 + 16));           // the attention moment, ~10 D + upcasts
  CHECK(f.attention == 2 * 4 * o.batch * g.heads * t * t);  // two fp32 score copies
  const models::ActivationEstimate s = models::estimate_training(g, o);
  CHECK(s.saved_inputs == g.blocks * rows * g.dim * 2);                  // every block's input stream
  CHECK(s.block == rows * (g.dim * (24 * 2 + 16) + 2 * g.ffn_dim * 2));  // graph ~24 D, upcasts, FFN 2 F
  CHECK(s.attention == 3 * 4 * o.batch * g.heads * t * t);               // probabilities + 2 gradients
  CHECK(s.total() == s.saved_inputs + s.block + s.attention);
  // Without recompute every other block keeps its forward graph (with the math backend half a block's
  // peak, with a fused kernel all of it: measured) and its probabilities (one of the three score copies)
  // until its backward.
  o.recompute = false;
  const models::ActivationEstimate kept = models::estimate_training(g, o);
  CHECK(kept.saved_inputs == s.saved_inputs);
  CHECK(kept.block == s.block + (g.blocks - 1) * s.block / 2);
  CHECK(kept.attention == s.attention + (g.blocks - 1) * s.attention / 3);
  o.math_attention = false;
  const models::ActivationEstimate fused = models::estimate_training(g, o);
  o.math_attention = true;
  const int64_t fused_block = rows * (g.dim * 24 * 2 + 2 * g.ffn_dim * 2);  // no fp32 upcasts
  CHECK(fused.block == g.blocks * fused_block);
  CHECK(fused.attention ==
        (3 + g.blocks - 1) * 4 * o.batch * g.heads * t * 2);  // log-sum-exp rows: 3, 1 per kept block
  o.recompute = true;

  // Cross-attention (Wan-like), fp32 (no upcasts), Ulysses over 2 ranks: image tokens only through the blocks.
  g.joint = false;
  g.text_tokens = 10;
  o.element_bytes = 4;
  o.sequence_parallel = 2;
  const int64_t local = 32, heads = 2;
  const models::ActivationEstimate c = models::estimate_training(g, o);
  CHECK(c.saved_inputs == g.blocks * o.batch * local * g.dim * 4 + o.batch * g.text_tokens * g.dim * 4);
  // The stream's graph, and the text's k and v (before and after their norm, with gradients: 4 D).
  CHECK(c.block == o.batch * local * (g.dim * 24 * 4 + 2 * g.ffn_dim * 4) + o.batch * g.text_tokens * g.dim * 4 * 4);
  CHECK(c.attention == 3 * 4 * o.batch * heads * 64 * 64 + 3 * 4 * o.batch * g.heads * local * g.text_tokens);
  // The FFN moment is the forward's larger one when the scores are small.
  g.ffn_dim = 4096;
  const models::ActivationEstimate ffn = models::estimate_forward(g, o);
  CHECK(ffn.attention == 0);
  CHECK(ffn.block == o.batch * local * (4 * g.dim + 2 * g.ffn_dim) * 4);
}

TEST_CASE("memory plan: the deck's predicted peak is the largest phase over its closed-form terms", "[plan][memory]") {
  const config::Config c = config::parse_deck(R"(
[model]
family = "sd3"
preset = "tiny"
[model.lora]
enabled = true
rank = 4
[precision]
forward = "bf16"
[rollout]
batch = 2
samples_per_prompt = 4
steps = 4
sde_steps = 1
window = [1, 2]
height = 8
width = 8
[train]
global_batch = 8
micro_batch = 2
)",
                                              "memory plan deck");
  const std::shared_ptr<models::Family> family = app::plan_family(c);
  const shard::Layout layout =
      shard::build_layout(*family, family->wrap_units(), app::compiled_plan(c, *family), /*world_size=*/2);
  const app::MemoryPlan m = app::memory_plan(c, *family, layout);
  const shard::MemoryReport r = layout.memory(true, true);
  CHECK(m.baseline == app::kProcessBaselineBytes);
  CHECK(m.state == r.masters + r.moments + r.grads + r.compute);
  CHECK(m.gathered == r.peak_gathered);
  CHECK(m.buffers == 4 * 4 * 64 * 4);  // pos_embed: the 4x4-patch crop of the 12x12 table, D = 64, fp32
  // 4 samples per rank: x_0, x_i and x_{i+1} of the SDE step, its velocity and x_T, [16, 8, 8] fp32 each,
  // and their conditioning rows (8 x 48 text states and 32 pooled values, fp32).
  CHECK(m.trajectories == 4 * (5 * 16 * 8 * 8 * 4 + (8 * 48 + 32) * 4));
  CHECK(m.rollout.total() > 0);
  CHECK(m.training.saved_inputs > 0);
  CHECK(m.peak() == std::max({m.load_peak(), m.rollout_peak(), m.training_peak()}));
  // Conditioning copies (no CFG): the family's cast to bf16 per forward, and training's index_select rows (fp32).
  const int64_t cond = (8 * 48 + 32) * 4, cast = (8 * 48 + 32) * 2;
  CHECK(m.rollout_inputs == 2 * cast);
  CHECK(m.training_inputs == 2 * (cond + cast));
  CHECK(m.training_peak() ==
        m.resident() + m.gathered + m.trajectories + m.training_inputs + m.training.total() + m.unit_grads);
  CHECK_THAT(m.text(), Contains("# predicted peak per rank: ") && Contains(std::to_string(m.peak()) + " B)"));
  // On a GPU: all but the process, with the two 32 MiB cuBLAS workspaces.
  CHECK(m.device_peak() == m.peak() - m.baseline + 2 * 33'554'432);
  CHECK_THAT(m.text(),
             Contains("allocator's predicted peak per rank (all but the process, with cuBLAS workspaces 0.067 GB): ") &&
                 Contains(std::to_string(m.device_peak()) + " B)"));
}

TEST_CASE("memory plan: GRPO trains a rollout micro-group per forward whatever train.micro_batch says",
          "[plan][memory]") {
  const auto plan_with = [](const std::string& micro_batch) {
    const config::Config c = config::parse_deck(
        "[model]\nfamily = \"sd3\"\n[rollout]\nmicrogroup = 1\n[train]\nmicro_batch = " + micro_batch + "\n", "deck");
    const std::shared_ptr<models::Family> family = app::plan_family(c);
    const shard::Layout layout = shard::build_layout(*family, family->wrap_units(), app::compiled_plan(c, *family), 1);
    return app::memory_plan(c, *family, layout);
  };
  const app::MemoryPlan one = plan_with("1"), eight = plan_with("8");
  CHECK(one.training.total() == eight.training.total());
  CHECK(one.training_inputs == eight.training_inputs);
  CHECK(one.training.total() > 0);
}

TEST_CASE("memory check: a plan over a rank's share fails naming the numbers / one that fits passes",
          "[plan][memory]") {
  const config::Config c = config::parse_deck("[model]\nfamily = \"sd3\"\n", "memory check deck");
  app::MemoryPlan plan;
  plan.state = 2'000'000'000;  // peak 2.18 GB with the process baseline
  CHECK_NOTHROW(app::check_plan_fits(c, plan, {2'180'000'000, "share"}, /*device=*/false));
  try {
    app::check_plan_fits(c, plan, {2'000'000'000, "this node has 8.00 GB for its 4 rank(s)"}, /*device=*/false);
    FAIL("2.18 GB fit in 2 GB");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains("memory check deck: the run needs about 2.18 GB per rank (`ditrl plan`'s predicted "
                                  "peak: load 2.18 GB") &&
                             Contains("but this node has 8.00 GB for its 4 rank(s); lower train.micro_batch") &&
                             Contains("run.check_memory = false"));
  }
  // On a GPU the process's host baseline is not on the device; the cuBLAS workspaces (64 MiB) are.
  CHECK_NOTHROW(app::check_plan_fits(c, plan, {2'067'108'864, "free"}, /*device=*/true));
  CHECK_THROWS_WITH(app::check_plan_fits(c, plan, {2'067'108'863, "the GPU has 2.07 GB free"}, /*device=*/true),
                    Contains("needs about 2.07 GB per rank (`ditrl plan`'s predicted peak on the GPU: load 2.07 GB, "
                             "rollout 2.07 GB, training 2.07 GB) but the GPU has 2.07 GB free"));
}

TEST_CASE("memory check: the host budget is at most the machine's memory", "[plan][memory]") {
  const std::optional<app::MemoryBudget> budget = app::host_memory_budget();
  REQUIRE(budget);
  CHECK(budget->bytes > 0);
  CHECK(budget->bytes <= static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  CHECK_FALSE(budget->source.empty());
}
