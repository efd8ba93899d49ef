// Negative controls for the fixture bounds (fixture_checks.hpp): a change to
// one weight element far smaller than any porting bug must fail them, or the
// bounds would not tell a faithful port from a slightly wrong one.

#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>

#include <torch/csrc/autograd/grad_mode.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"

#include <string>

using namespace ditrl;
using namespace ditrl::models;
using test::fixture_path;

namespace {

struct FamilyOutput {
  const char* family;
  const char* output;
};

const FamilyOutput kFamilies[] = {
    {"sd3", "output"}, {"wan", "output"}, {"qwen_image", "output"}, {"ltx", "output.video"}, {"flux", "output"}, {"flux2", "output"}};

// The first element of the output projection `proj_out.weight` (it feeds
// the first output channel of every token) scaled by 1 + `relative`.
void nudge_proj_out(Family& family, double relative) {
  torch::NoGradGuard no_grad;
  at::Tensor w = family.named_parameters()["proj_out.weight"];
  w.view({-1})[0].mul_(1 + relative);
}

}  // namespace

TEST_CASE(
    "fixture bounds: a 2^-16 relative change of one weight element fails the fp32 bound (2^-9 under the 128-ulp bound)",
    "[models][fixtures]") {
  for (const FamilyOutput& b : kFamilies) {
    INFO(b.family);
    auto family = test::fixture_family(b.family);
    const ReferenceCase c = load_reference_case(fixture_path(std::string(b.family) + "/case_0.safetensors"));
    const at::Tensor ref = c.stored.at(b.output);
    const double bound = test::fixture_fp32_ulps(b.family);
    CHECK(test::fp32_ulps_off(run_reference_case(*family, c, false).at(b.output), ref) <= bound);
    nudge_proj_out(*family, test::fixture_nudge(b.family));
    const double ulps = test::fp32_ulps_off(run_reference_case(*family, c, false).at(b.output), ref);
    WARN(b.family << ": one weight element x (1 + " << test::fixture_nudge(b.family) << ") moves " << b.output
                  << " by " << ulps << " fp32 ulps of its max (bound " << bound << ")");
    CHECK(ulps > bound);
  }
}

// LTX's bf16 case runs ltx_core's eager output tail (test_ltx.cpp), not the
// default fp32 one, and is checked by the same check_bf16_output there.
TEST_CASE("fixture bounds: one weight element one bf16 ulp up breaks bf16 bit equality", "[models][fixtures]") {
  for (const FamilyOutput& b : {kFamilies[0], kFamilies[1], kFamilies[2], kFamilies[4]}) {
    INFO(b.family);
    auto family = test::fixture_family(b.family);
    cast_parameters(*family, at::kBFloat16, family->default_overrides());
    const ReferenceCase c = load_reference_case(fixture_path(std::string(b.family) + "/case_bf16.safetensors"));
    const at::Tensor ref = c.stored.at(b.output);
    CHECK(at::equal(run_reference_case(*family, c, false).at(b.output), ref));
    nudge_proj_out(*family, std::ldexp(1.0, -6));  // >= 1 bf16 ulp (8 significant bits)
    const at::Tensor out = run_reference_case(*family, c, false).at(b.output);
    WARN(b.family << ": one bf16 weight element x (1 + 2^-6) changes "
                  << out.ne(ref).to(at::kDouble).mean().item<double>() << " of the bf16 " << b.output);
    CHECK_FALSE(at::equal(out, ref));
  }
}
