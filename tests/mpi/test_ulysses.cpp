// ditrl-mpi-ranks: 2 4
//
// Ulysses sequence parallelism against the unsplit forward on every rank.
// Forward outputs and the latents' gradient must be bitwise equal: every
// per-token op sees the same rows, and attention runs over the whole
// sequence for its heads. Parameter and text gradients are sums over tokens,
// which the split adds in another order (each rank's part, then the group's
// sum in rank order); they are compared with a tolerance and the measured
// difference is printed.
//
// Sizes keep every rank's GEMMs on MKL's large-matrix path (>= 96 rows, >= 16
// columns): below that MKL's small-matrix kernels round a row differently
// depending on the row count (measured, see docs/gpus-and-clusters.md, sequence parallelism).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/sequence_parallel.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/ulysses.hpp>
#include <ditrl/models/wan/wan.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>

#include "mpi_world.hpp"
#include "ulysses_case.hpp"

namespace ditrl {
namespace {

using Catch::Matchers::Contains;

using test::Grid;
using test::Inputs;
using test::make_inputs;
using test::make_wan;
using test::Pass;
using test::relative_difference;
using test::run;

// tiny-video LTX-2.3 (4 heads, gated attention, prompt AdaLN) on a 4 x 8 x 8
// grid: 256 tokens.
std::shared_ptr<models::Family> make_ltx(const Grid& g) {
  models::LtxConfig c = models::LtxConfig::preset("tiny-video");
  c.text_tokens = 16;
  models::FamilyOptions o;
  o.family = "ltx";
  o.latent_grid = {g.frames, g.height, g.width, 24.0};
  auto ltx = std::make_shared<models::LTX>(c, o);
  models::init_parameters(*ltx, 13);
  return ltx;
}

// The unsplit pass and the pass at sequence_parallel = n on every rank, then
// the checks above.
void check_against_unsplit(models::Family& family, int n, const Grid& grid, bool per_token) {
  auto world = dist::make_mpi_communicator();
  dist::SequenceGroups groups(*world, n);
  const Inputs in = make_inputs(family, grid, per_token);
  const Pass ref = run(family, in, nullptr);
  const models::Ulysses ulysses(groups.group());
  const Pass sp = run(family, in, &ulysses);

  CHECK(at::equal(sp.output, ref.output));
  // Each rank's latents gradient covers its own tokens only (every latent
  // element belongs to one token), so the group's sum is exact.
  const auto nonzero = [](const at::Tensor& t) { return t.ne(0).sum().item<int64_t>(); };
  CHECK(nonzero(sp.d_latents) * n == nonzero(ref.d_latents));
  CHECK(at::equal(test::group_mean(groups.group(), sp.d_latents), ref.d_latents));
  double worst = relative_difference(test::group_mean(groups.group(), sp.d_context), ref.d_context);
  std::string worst_name = in.context_name;
  CHECK(worst < 1e-5);
  REQUIRE(sp.grads.size() == ref.grads.size());
  for (const auto& [name, g] : ref.grads) {
    INFO("parameter " << name);
    const double d = relative_difference(test::group_mean(groups.group(), sp.grads.at(name)), g);
    CHECK(d < 1e-5);
    if (d > worst) worst = d, worst_name = name;
  }
  if (test::rank() == 0)
    std::printf(
        "ulysses %s SP %d of %d ranks%s: output and d_latents bitwise; worst gradient difference %.3g of its max "
        "(%s)\n",
        family.family_name().c_str(), n, world->size(), per_token ? " (per-token timesteps)" : "", worst,
        worst_name.c_str());
}

}  // namespace

TEST_CASE("ulysses: wan at sequence_parallel = world equals the unsplit forward and backward", "[ulysses]") {
  check_against_unsplit(*make_wan(4), test::world(), Grid{}, /*per_token=*/false);
}

TEST_CASE("ulysses: wan with per-token timesteps (TI2V) equals the unsplit forward and backward", "[ulysses]") {
  check_against_unsplit(*make_wan(4), test::world(), Grid{}, /*per_token=*/true);
}

TEST_CASE("ulysses: ltx-2.3 video at sequence_parallel = world equals the unsplit forward and backward", "[ulysses]") {
  Grid g;
  g.height = g.width = 8;
  check_against_unsplit(*make_ltx(g), test::world(), g, /*per_token=*/false);
}

TEST_CASE("ulysses: wan and ltx at sequence_parallel = 2 in groups of the world", "[ulysses]") {
  if (test::world() == 2) {
    SUCCEED("two ranks form one group: the cases above cover it");
    return;
  }
  check_against_unsplit(*make_wan(4), 2, Grid{}, /*per_token=*/false);
  Grid g;
  g.height = g.width = 8;
  check_against_unsplit(*make_ltx(g), 2, g, /*per_token=*/false);
}

TEST_CASE("ulysses: the all-to-all round trip restores the token split", "[ulysses]") {
  auto world = dist::make_mpi_communicator();
  const models::Ulysses ulysses(*world);
  const int n = world->size();
  at::manual_seed(3);
  const at::Tensor full = at::randn({2, 4 * n, 8 * n, 5});  // (B, H, L, Dh) of the whole sequence
  const at::Tensor local = ulysses.shard(full, 2);
  const at::Tensor heads = ulysses.tokens_to_heads(local);
  CHECK(at::equal(heads, full.narrow(1, world->rank() * 4, 4)));
  CHECK(at::equal(ulysses.heads_to_tokens(heads), local));
  CHECK(at::equal(ulysses.gather(local, 2), full));
}

TEST_CASE("ulysses: a head or token count the group does not divide is an error on every rank", "[ulysses]") {
  auto world = dist::make_mpi_communicator();
  const int n = world->size();
  const models::Ulysses ulysses(*world);
  models::ForwardContext ctx;
  ctx.ulysses = &ulysses;
  {
    auto wan = make_wan(n + 1);  // heads % n != 0 for n >= 2
    const Inputs in = make_inputs(*wan, Grid{}, false);
    models::Cond cond;
    cond.tensors[in.context_name] = in.context;
    CHECK_THROWS_WITH(wan->noise_pred(in.latents, in.timesteps, in.sigmas, cond, ctx),
                      Contains("attention heads, which parallel.sequence_parallel = " + std::to_string(n)));
  }
  auto wan = make_wan(4 * n);
  Grid odd;
  odd.frames = 1, odd.height = 2, odd.width = 2 * (2 * n + 1);  // 2n + 1 tokens
  const Inputs in = make_inputs(*wan, odd, false);
  models::Cond cond;
  cond.tensors[in.context_name] = in.context;
  CHECK_THROWS_WITH(wan->noise_pred(in.latents, in.timesteps, in.sigmas, cond, ctx),
                    Contains("latent grid (frames x height x width patches) has " + std::to_string(2 * n + 1)));
  CHECK_THROWS_WITH(dist::sequence_layout(0, 4, 3), Contains("parallel.sequence_parallel = 3 does not divide"));
  CHECK_THROWS_WITH(dist::sequence_layout(0, 4, 0), Contains("parallel.sequence_parallel = 0"));
  const dist::SequenceLayout l = dist::sequence_layout(5, 8, 4);
  CHECK((l.size == 4 && l.rank == 1 && l.data_rank == 1 && l.data_size == 2));
}

}  // namespace ditrl
