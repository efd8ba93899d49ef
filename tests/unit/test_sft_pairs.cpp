// SFT pairs (docs/algorithms.md §5): grid indices drawn per sample; with two
// experts every micro-batch trains one expert, a function of its window and
// its place in its chunk, so the same on every rank at any rank count.
#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/rl/pairs.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <set>

using namespace ditrl;

namespace {

// A rank's view of 8 samples (global ids first..first+7) on a shift-3 Wan grid.
rl::RolloutView view_of_rank(int64_t first) {
  rl::RolloutView v;
  v.final_latents = at::zeros({8, 4});
  v.advantages = at::zeros({8});
  v.sample_index = at::arange(first, first + 8, at::kLong);
  diffusion::SchedulePresetOptions o;
  o.steps = 6;
  o.shift = 3.0;
  v.snapshot = std::make_shared<const diffusion::Schedule>(models::family_schedule("wan", o));
  return v;
}

size_t expert_of(float t) {
  return t >= 875.0f ? 0 : 1;
}

}  // namespace

TEST_CASE("sft pairs: one expert per micro-batch / keyed by window and chunk position / both experts trained",
          "[rl][sft]") {
  const rl::RolloutView rank0 = view_of_rank(0), rank1 = view_of_rank(8);
  std::vector<size_t> experts;
  for (int64_t i = 0; i < rank0.snapshot->steps(); ++i) experts.push_back(expert_of(rank0.snapshot->timestep(i)));
  REQUIRE(std::set<size_t>(experts.begin(), experts.end()).size() == 2);  // the grid spans both experts

  // Micro-batches of 2 pairs, chunks of 4 pairs (2 micro-batches), 2 windows:
  // pair p of a view is micro-batch p % 4 / 2 of its chunk, in window p / 4 % 2.
  const rl::SftRouting routing{2, 4, 2};
  std::set<size_t> seen;
  for (int64_t rollout = 0; rollout < 8; ++rollout) {
    const auto a = rl::sft_pairs(rank0, 1, 7, rollout, experts, routing);
    const auto b = rl::sft_pairs(rank1, 1, 7, rollout, experts, routing);
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == 8);
    for (size_t i = 0; i < a.size(); i += 2) {
      const size_t e = expert_of(a[i].timestep);
      CHECK(expert_of(a[i + 1].timestep) == e);
      CHECK(expert_of(b[i].timestep) == e);  // rank 1's chunks sit at the same window and position
      CHECK(expert_of(b[i + 1].timestep) == e);
      const int64_t window = static_cast<int64_t>(i) / 4 % 2, micro = static_cast<int64_t>(i) % 4 / 2;
      CHECK(rl::stable_hash("expert", 7, rollout, window, micro) % 2 == e);  // pools[k] is expert k's
      seen.insert(e);
    }
  }
  CHECK(seen.size() == 2);
}

TEST_CASE("sft pairs: a single DiT draws from the whole grid per sample", "[rl][sft]") {
  const rl::RolloutView v = view_of_rank(8);
  const auto pairs = rl::sft_pairs(v, 1, 7, 3);
  REQUIRE(pairs.size() == 8);
  for (int64_t row = 0; row < 8; ++row) {
    at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("sample", 7, 3, 8 + row));
    const int64_t idx =
        at::randint(v.snapshot->steps(), {1}, gen, at::TensorOptions().dtype(at::kLong)).item<int64_t>();
    CHECK(pairs[row].timestep == v.snapshot->timestep(idx));
    CHECK(pairs[row].sample_index == 8 + row);
  }
}
