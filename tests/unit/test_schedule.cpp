#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/family_traits.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <rl_reference_values.hpp>
#include <safetensors_reader.hpp>

#include <cstring>

using namespace ditrl::diffusion;
using ditrl::models::family_schedule;

namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

std::vector<uint32_t> bit_list(const at::Tensor& t) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(bits(t.data_ptr<float>()[i]));
  return out;
}

FlowMatchOptions options_of(const ditrl::test::FlowMatchReference& r) {
  FlowMatchOptions o;
  o.steps = r.steps;
  o.shift = r.shift;
  if (r.dynamic) o.dynamic = DynamicShift{r.mu, r.linear ? TimeShiftType::Linear : TimeShiftType::Exponential};
  if (r.shift_terminal > 0) o.shift_terminal = r.shift_terminal;
  if (r.qwen_sigmas) o.sigmas = numpy_linspace(1.0, 1.0 / static_cast<double>(r.steps), r.steps);
  return o;
}

}  // namespace

TEST_CASE("schedule: FlowMatchEuler grids match the NumPy/torch recipe bit for bit", "[diffusion][schedule]") {
  for (const auto& ref : ditrl::test::flow_match_references()) {
    INFO(ref.name);
    const Schedule s = flow_match_schedule(options_of(ref));
    s.check(ref.name);
    CHECK(bit_list(s.timesteps) == ref.timesteps);
    CHECK(bit_list(s.sigmas) == ref.sigmas);
  }
}

TEST_CASE("schedule: SD3.5 10 steps reproduces the spec's numbers and the sde fixture grid", "[diffusion][schedule]") {
  FlowMatchOptions o;
  o.steps = 10;
  o.shift = 3.0;
  const Schedule s = flow_match_schedule(o);
  // docs/algorithms.md §2.2 reference numbers (5 digits) and the exact last non-terminal sigma (§1.2).
  const std::vector<double> spec = {1.0,     0.96013, 0.91335, 0.85769, 0.79037, 0.70728,
                                    0.60215, 0.46488, 0.27805, 0.00893, 0.0};
  for (size_t i = 0; i < spec.size(); ++i) CHECK(s.sigma(static_cast<int64_t>(i)) == Approx(spec[i]).margin(5e-6));
  CHECK(static_cast<double>(s.sigma(9)) == 0.008928571827709675);
  CHECK(s.sigma(10) == 0.0f);
  for (int64_t i = 0; i < 10; ++i) CHECK(bits(s.timestep(i)) == bits(s.sigma(i) * 1000.0f));

  // The shared sde fixtures were computed on diffusers' own scheduler.
  for (const auto& [file, shift, steps] : {std::tuple{"sde_0", 3.0, 10}, std::tuple{"cps_1", 1.0, 6}}) {
    const auto fx = ditrl::test::read_safetensors(std::string(DITRL_FIXTURES_DIR) + "/sde/" + file + ".safetensors");
    FlowMatchOptions g;
    g.steps = steps;
    g.shift = shift;
    const Schedule grid = flow_match_schedule(g);
    CHECK(at::equal(grid.sigmas, fx.at("sigmas")));
    CHECK(at::equal(grid.timesteps, fx.at("timesteps")));
  }
}

TEST_CASE("schedule: 40-step SD3.5 timesteps do not divide back to their sigmas", "[diffusion][schedule]") {
  FlowMatchOptions o;
  o.steps = 40;
  o.shift = 3.0;
  const Schedule s = flow_match_schedule(o);
  // docs/algorithms.md §1.3: sigma[9] and sigma[11] fail the t/1000 round trip by -1 and +1 ULP.
  CHECK(static_cast<double>(s.sigma(9)) == 0.9094123840332031);
  CHECK(static_cast<double>(s.timestep(9)) == 909.412353515625);
  CHECK(static_cast<double>(s.timestep(9) / 1000.0f) == 0.9094123244285583);
  CHECK(bits(s.timestep(9) / 1000.0f) == bits(s.sigma(9)) - 1);
  CHECK(static_cast<double>(s.sigma(11)) == 0.884637176990509);
  CHECK(bits(s.timestep(11) / 1000.0f) == bits(s.sigma(11)) + 1);
  int failing = 0;
  for (int64_t i = 0; i < 40; ++i) failing += s.timestep(i) / 1000.0f != s.sigma(i);
  CHECK(failing == 2);
}

TEST_CASE("schedule: Qwen-Image terminal sigma sits one ULP off 0.02", "[diffusion][schedule]") {
  for (int64_t n : {10, 20, 50}) {
    SchedulePresetOptions p;
    p.steps = n;
    p.height = 64;  // 512x512 pixels: 64x64 latents, 1024 packed tokens, mu = 0.53871
    p.width = 64;
    const Schedule s = family_schedule("qwen_image", p);
    CHECK(static_cast<double>(s.sigma(n - 1)) == 0.020000040531158447);
    CHECK(s.sigma(0) == 1.0f);
    CHECK(s.sigma(n) == 0.0f);
  }
  CHECK(resolution_mu(1024, ResolutionShift{256, 8192, 0.5, 0.9}) == Approx(0.53871).margin(1e-5));
  SchedulePresetOptions small;
  small.height = 32;  // 256 tokens: the stretch rounds the other way
  small.width = 32;
  CHECK(static_cast<double>(family_schedule("qwen_image", small).sigma(9)) == 0.019999980926513672);
}

TEST_CASE("schedule: ltx_core LTX2Scheduler grids bit for bit", "[diffusion][schedule]") {
  for (const auto& ref : ditrl::test::ltx2_references()) {
    INFO("steps " << ref.steps << " tokens " << ref.tokens);
    Ltx2Options o;
    o.steps = ref.steps;
    o.tokens = ref.tokens;
    const Schedule s = ltx2_schedule(o);
    CHECK(bit_list(s.timesteps) == ref.timesteps);
    CHECK(bit_list(s.sigmas) == ref.sigmas);
  }
  SchedulePresetOptions p;
  p.steps = 10;
  p.frames = 8;
  p.height = 16;
  p.width = 24;  // 3072 tokens
  CHECK(bit_list(family_schedule("ltx", p).sigmas) == ditrl::test::ltx2_references()[0].sigmas);
  CHECK(static_cast<double>(family_schedule("ltx", p).sigma(9)) == Approx(0.1).margin(1e-6));
}

TEST_CASE("schedule: family presets and the deck's shift override", "[diffusion][schedule]") {
  SchedulePresetOptions p;
  p.steps = 10;
  const auto& refs = ditrl::test::flow_match_references();
  CHECK(bit_list(family_schedule("sd3", p).sigmas) == refs[0].sigmas);
  p.steps = 40;
  CHECK(bit_list(family_schedule("wan", p).sigmas) == refs[7].sigmas);  // Wan2.2 A14B sample_shift 12
  p.steps = 6;
  p.shift = 1.0;
  for (const char* family : {"sd3", "wan", "ltx", "qwen_image"})
    CHECK(bit_list(family_schedule(family, p).sigmas) == refs[1].sigmas);
  CHECK_THROWS_WITH(family_schedule("sdxl", p), Catch::Contains("unknown family 'sdxl'"));
  p.shift.reset();
  p.height = 15;
  CHECK_THROWS_WITH(family_schedule("qwen_image", p), Catch::Contains("must be even"));
}

TEST_CASE("schedule: bad options and malformed snapshots are errors", "[diffusion][schedule]") {
  FlowMatchOptions o;
  o.steps = 0;
  CHECK_THROWS_WITH(flow_match_schedule(o), Catch::Contains("steps must be >= 1"));
  o.steps = 4;
  o.shift_terminal = 1.5;
  CHECK_THROWS_WITH(flow_match_schedule(o), Catch::Contains("shift_terminal"));
  o.shift_terminal.reset();
  o.sigmas = {1.0, 0.0};
  CHECK_THROWS_WITH(flow_match_schedule(o), Catch::Contains("outside (0, 1]"));

  Schedule s{at::zeros({3}, at::kFloat), at::zeros({3}, at::kFloat)};
  CHECK_THROWS_WITH(s.check("trajectory 4"), Catch::Contains("trajectory 4") && Catch::Contains("[T+1]"));
  s.sigmas = at::zeros({4}, at::kDouble);
  CHECK_THROWS_WITH(s.check("trajectory 4"), Catch::Contains("fp32"));
  CHECK(from_bits(0x3f800000) == 1.0f);
}

TEST_CASE("schedule: numpy linspace arithmetic", "[diffusion][schedule]") {
  const auto y = numpy_linspace(1000.0, 2.994012087583542, 5);
  REQUIRE(y.size() == 5);
  CHECK(y.front() == 1000.0);
  CHECK(y.back() == 2.994012087583542);
  const double step = (2.994012087583542 - 1000.0) / 4;
  CHECK(y[2] == 2 * step + 1000.0);
  CHECK(numpy_linspace(0.5, 0.1, 1) == std::vector<double>{0.5});
  CHECK(numpy_linspace(3.0, 3.0, 3) == std::vector<double>{3.0, 3.0, 3.0});
}
