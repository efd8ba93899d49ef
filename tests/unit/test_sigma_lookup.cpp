#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/prepared_batch.hpp>
#include <ditrl/rl/sigma_lookup.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>

using namespace ditrl;
using namespace ditrl::rl;

namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// A snapshot with the given sigmas (terminal 0 appended) and t = fl32(sigma * 1000).
diffusion::Schedule snapshot_of(std::vector<float> sigmas) {
  const auto n = static_cast<int64_t>(sigmas.size());
  sigmas.push_back(0.0f);
  diffusion::Schedule s{at::empty({n}, at::kFloat), at::tensor(sigmas, at::kFloat)};
  for (int64_t i = 0; i < n; ++i) s.timesteps.data_ptr<float>()[i] = sigmas[static_cast<size_t>(i)] * 1000.0f;
  return s;
}

diffusion::Schedule sd35_40() {
  diffusion::FlowMatchOptions o;
  o.steps = 40;
  o.shift = 3.0;
  return diffusion::flow_match_schedule(o);
}

}  // namespace

TEST_CASE("lookup: exact match returns the snapshot's sigmas (miles' CPU test)", "[rl][lookup]") {
  const diffusion::Schedule s = snapshot_of({0.9782581925392151f, 0.8f, 0.5f});
  const at::Tensor t = s.timesteps;
  const auto e = lookup_sigmas(s, at::stack({t[2], t[0]}));
  CHECK(at::equal(e.sigmas, at::stack({s.sigmas[2], s.sigmas[0]})));
  CHECK(at::equal(e.sigmas_next, at::stack({s.sigmas[3], s.sigmas[1]})));
  CHECK(at::equal(e.indices, at::tensor({2, 0}, at::kLong)));
  CHECK(at::equal(e.timesteps, at::stack({t[2], t[0]})));
  CHECK_THROWS_WITH(lookup_sigmas(s, at::tensor({123.456f})), Catch::Contains("not found"));
}

TEST_CASE("lookup: ULP-apart t and sigma: the lookup returns sigma's bits / rescaling t would not", "[rl][lookup]") {
  // miles' example: sigma 0.8474337458610535 -> t 847.4337158203125, t / 1000 = 0.8474336862564087 (-1 ULP).
  const float sigma = 0.8474337458610535f;
  const diffusion::Schedule s = snapshot_of({1.0f, sigma, 0.5f});
  CHECK(static_cast<double>(s.timestep(1)) == 847.4337158203125);
  const float rescaled = s.timestep(1) / 1000.0f;
  CHECK(static_cast<double>(rescaled) == 0.8474336862564087);
  CHECK(bits(rescaled) == bits(sigma) - 1);
  const auto e = lookup_sigmas(s, at::tensor({847.4337158203125f}));
  CHECK(bits(e.sigmas.item<float>()) == bits(sigma));
  CHECK(static_cast<double>(e.sigmas.item<float>()) == 0.8474337458610535);

  // SD3.5 40 steps, shift 3: every step's sigma comes back bitwise; steps 9 and 11 would not survive t / 1000.
  const diffusion::Schedule grid = sd35_40();
  const auto all = lookup_sigmas(grid, grid.timesteps);
  CHECK(at::equal(all.sigmas, grid.sigmas.narrow(0, 0, 40)));
  CHECK(at::equal(all.sigmas_next, grid.sigmas.narrow(0, 1, 40)));
  const at::Tensor rescaled_all = grid.timesteps / 1000.0;
  const at::Tensor differs = rescaled_all != grid.sigmas.narrow(0, 0, 40);
  CHECK(differs.sum().item<int64_t>() == 2);
  CHECK(differs[9].item<bool>());
  CHECK(differs[11].item<bool>());
  CHECK(ulp_distance(grid.sigma(9), rescaled_all[9].item<float>()) == -1);
  CHECK(ulp_distance(grid.sigma(11), rescaled_all[11].item<float>()) == 1);
}

TEST_CASE("lookup: a miss names the value / its bits and the nearest entries with ULP distances", "[rl][lookup]") {
  const diffusion::Schedule grid = sd35_40();
  const float t9 = grid.timestep(9);
  const float off = std::nextafter(t9, 2000.0f);  // one ULP above step 9's t
  try {
    lookup_sigmas(grid, at::tensor({grid.timestep(3), off}));
    FAIL("expected a lookup miss");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains(fmt::format("timestep {} (fp32 bits 0x{:08X})", off, bits(off))));
    CHECK_THAT(msg, Catch::Contains("query 1 of 2"));
    CHECK_THAT(msg, Catch::Contains(fmt::format("[9] = {} (fp32 bits 0x{:08X}), -1 ULP", t9, bits(t9))));
    CHECK_THAT(msg, Catch::Contains("[8] = "));
    CHECK_THAT(msg, Catch::Contains("never rescaled"));
  }
  // A rescaled sigma is not a timestep of the snapshot either.
  CHECK_THROWS_WITH(lookup_sigmas(grid, at::tensor({grid.sigma(9) * 1000.0f + 0.001f})), Catch::Contains("not found"));
  CHECK_THROWS_WITH(lookup_sigmas(grid, at::tensor({909.0})), Catch::Contains("1-D fp32"));
}

TEST_CASE("lookup: reverse lookup sigma -> index -> t for NFT", "[rl][lookup]") {
  const diffusion::Schedule grid = sd35_40();
  const auto e = lookup_timesteps(grid, at::stack({grid.sigmas[11], grid.sigmas[0], grid.sigmas[39]}));
  CHECK(at::equal(e.indices, at::tensor({11, 0, 39}, at::kLong)));
  CHECK(bits(e.timesteps[0].item<float>()) == bits(grid.timestep(11)));
  CHECK(bits(e.timesteps[2].item<float>()) == bits(grid.timestep(39)));
  // the terminal 0 is not a trainable sigma
  CHECK_THROWS_WITH(lookup_timesteps(grid, at::tensor({0.0f})),
                    Catch::Contains("sigma 0") && Catch::Contains("not found"));
}

TEST_CASE("lookup: duplicate snapshot values are ambiguous", "[rl][lookup]") {
  const diffusion::Schedule s = snapshot_of({1.0f, 0.5f, 0.5f});
  CHECK_THROWS_WITH(lookup_sigmas(s, at::tensor({500.0f})), Catch::Contains("[1] and [2]"));
}

TEST_CASE("prepared batch: stacks pairs / carries both domains and the conditioning rows", "[rl][lookup]") {
  auto snap = std::make_shared<diffusion::Schedule>(sd35_40());
  std::vector<TrainPair> pairs;
  for (int64_t i = 0; i < 3; ++i) {
    TrainPair p;
    p.latent = at::full({2, 3}, static_cast<double>(i), at::kBFloat16);
    p.next_latent = at::full({2, 3}, static_cast<double>(i) + 0.5, at::kFloat);
    p.timestep = snap->timestep(9 + i);
    p.log_prob_old = -1.0f - static_cast<float>(i);
    p.advantage = 0.25f * static_cast<float>(i);
    p.sample_index = 10 + i;
    p.prompt_index = 4 + i / 2;
    p.snapshot = snap;
    pairs.push_back(p);
  }
  // a separately deserialised, bitwise-equal snapshot is accepted
  pairs[2].snapshot =
      std::make_shared<diffusion::Schedule>(diffusion::Schedule{snap->timesteps.clone(), snap->sigmas.clone()});
  const PreparedBatch b = prepare_batch(pairs, c10::kCPU);
  CHECK(b.size() == 3);
  CHECK(b.latents.scalar_type() == at::kFloat);
  CHECK(b.latents.sizes() == at::IntArrayRef{3, 2, 3});
  CHECK(b.next_latents[1][0][0].item<float>() == 1.5f);
  CHECK(at::equal(b.step_indices, at::tensor({9, 10, 11}, at::kLong)));
  CHECK(at::equal(b.sigmas, snap->sigmas.narrow(0, 9, 3)));
  CHECK(at::equal(b.sigmas_next, snap->sigmas.narrow(0, 10, 3)));
  CHECK(at::equal(b.timesteps, snap->timesteps.narrow(0, 9, 3)));
  CHECK(at::equal(b.prompt_indices, at::tensor({4, 4, 5}, at::kLong)));
  CHECK(at::equal(b.sample_indices, at::tensor({10, 11, 12}, at::kLong)));
  CHECK(b.step_timestep == snap->timesteps[9].item<float>());  // the guidance decision, read on the host
  CHECK(b.prompt_indices.device().is_cpu());
  CHECK(at::equal(b.host_timesteps, b.timesteps));  // Wan2.2's expert, read on the host
  CHECK(b.host_timesteps.device().is_cpu());
  CHECK(at::equal(b.host_sigmas, b.sigmas));  // SFT's metric buckets, read on the host
  CHECK(b.host_sigmas.device().is_cpu());
  CHECK(b.log_prob_old[2].item<float>() == -3.0f);
  const auto ss = b.step_sigmas();
  CHECK(ss.sigma_after_one == snap->sigma(1));
  CHECK(at::equal(ss.sigma, b.sigmas));
}

TEST_CASE("prepared batch: samples with different snapshots are rejected / naming the sample", "[rl][lookup]") {
  auto snap = std::make_shared<diffusion::Schedule>(sd35_40());
  auto other =
      std::make_shared<diffusion::Schedule>(diffusion::Schedule{snap->timesteps.clone(), snap->sigmas.clone()});
  other->sigmas.data_ptr<float>()[7] = std::nextafter(snap->sigma(7), 2.0f);
  std::vector<TrainPair> pairs(2);
  for (int i = 0; i < 2; ++i) {
    pairs[i].latent = at::zeros({4});
    pairs[i].timestep = snap->timestep(3);
    pairs[i].sample_index = i == 0 ? 0 : 5;
  }
  pairs[0].snapshot = snap;
  pairs[1].snapshot = other;
  CHECK_THROWS_WITH(prepare_batch(pairs, c10::kCPU),
                    Catch::Contains("sample 5 carries different scheduler sigmas than sample 0") &&
                        Catch::Contains("entry [7]") && Catch::Contains("+1 ULP"));
  auto shorter = std::make_shared<diffusion::Schedule>(diffusion::flow_match_schedule({}));
  pairs[1].snapshot = shorter;
  CHECK_THROWS_WITH(prepare_batch(pairs, c10::kCPU), Catch::Contains("sample 5 carries timesteps of shape 10"));
  pairs[1].snapshot = nullptr;
  CHECK_THROWS_WITH(prepare_batch(pairs, c10::kCPU), Catch::Contains("no schedule snapshot"));
  CHECK_THROWS_WITH(prepare_batch({}, c10::kCPU), Catch::Contains("no train pairs"));
}
