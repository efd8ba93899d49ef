// `ditrl plan DECK`: the sharding and precision plan of the deck's model
// without loading weights (the family is built on the meta device).

#include <ditrl/app/commands.hpp>
#include <ditrl/app/memory_plan.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/shard/plan_report.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <set>

namespace ditrl::app {

namespace {

std::string gib(int64_t bytes) {
  return fmt::format("{:.3f} GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

// Training activation bytes per rank at sequence_parallel = 1, the deck's
// value and the powers of two that divide the heads and tokens (up to 8).
std::string activation_table(const config::Config& c, const models::Family& family) {
  const auto geometry = models::traits_of(family).activation_geometry(family, latent_grid(c));
  if (!geometry) return "# activations per rank: no model for family '" + family.family_name() + "'\n";
  models::ActivationOptions o;
  o.batch = training_micro_batch(c);
  o.element_bytes = precision::dtype_bytes(c.precision.forward);
  o.math_attention = c.precision.attention == models::AttentionBackend::Math;
  std::set<int64_t> sizes = {1, c.parallel.sequence_parallel};
  for (int64_t n = 2; n <= 8; n *= 2)
    if (geometry->heads % n == 0 && geometry->tokens % n == 0) sizes.insert(n);
  std::string out = fmt::format(
      "# training activations per rank (models/activation_memory.hpp): {} tokens + {} text tokens, "
      "micro-batch {} (without CFG), {} forward, {} attention\n",
      geometry->tokens, geometry->text_tokens, o.batch, precision::dtype_name(c.precision.forward),
      name_of(models::kAttentionNames, c.precision.attention));
  for (const int64_t n : sizes) {
    if (geometry->heads % n != 0 || geometry->tokens % n != 0) continue;
    if (n > 1 && n != c.parallel.sequence_parallel) {
      try {
        family.check_sequence_parallel(n, latent_grid(c));
      } catch (const Error&) {
        continue;  // a family without a sequence-parallel forward (SD3, Qwen-Image)
      }
    }
    o.sequence_parallel = n;
    const models::ActivationEstimate e = models::estimate_training(*geometry, o);
    out += fmt::format("#   sequence_parallel = {}{}: {} (block inputs {}, one block's graph {}, attention {})\n", n,
                       n == c.parallel.sequence_parallel ? " (deck)" : "", gib(e.total()), gib(e.saved_inputs),
                       gib(e.block), gib(e.attention));
  }
  return out;
}

}  // namespace

void add_plan_command(CLI::App& app, Command& selected) {
  struct Options {
    std::string deck;
    std::vector<std::string> overrides;
    int ranks = 1;
    int rank = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Print every parameter's unit, shard range, dtypes, precision rule and the bytes per rank");
  sub->add_option("deck", options->deck, "TOML deck")->required();
  sub->add_option("--set", options->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--ranks", options->ranks, "World size to shard over")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--rank", options->rank, "Rank whose shard ranges are shown")->check(CLI::NonNegativeNumber);
  sub->callback([options, &selected] {
    selected = [options] {
      const config::Config config = config::load_deck(options->deck, options->overrides);
      // The model `ditrl train` builds, on the meta device.
      const std::shared_ptr<models::Family> family = plan_family(config);
      const precision::CompiledPlan plan = compiled_plan(config, *family);
      const shard::PlanReport report =
          shard::plan_report(*family, family->wrap_units(), plan, options->ranks, options->rank,
                             config.parallel.prefetch, config.parallel.reshard_after_forward);
      const shard::Layout layout = shard::build_layout(*family, family->wrap_units(), plan, options->ranks);
      std::cout << "# plan of " << options->deck << " (" << family->family_name() << ", " << config.model.preset
                << ") over " << options->ranks << " ranks\n"
                << report.table() << activation_table(config, *family) << memory_plan(config, *family, layout).text();
      // Buffers a checkpoint carries, named as in the file (benchmarks/real_size/write_weights.py reads these).
      for (const auto& b : family->named_buffers())
        std::cout << fmt::format("# checkpoint buffer: {} [{}] {}\n", b.key(), fmt::join(b.value().sizes(), ", "),
                                 precision::dtype_name(b.value().scalar_type()));
      return 0;
    };
  });
}

}  // namespace ditrl::app
