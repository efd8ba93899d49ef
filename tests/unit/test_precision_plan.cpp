#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/precision/names.hpp>
#include <ditrl/precision/plan.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

using namespace ditrl::precision;
using Catch::Matchers::Contains;

namespace {

const std::vector<std::string> kNames{
    "pos_embed.proj.weight",
    "transformer_blocks.0.norm1.linear.weight",
    "transformer_blocks.0.attn.to_q.weight",
    "transformer_blocks.0.attn.to_q.bias",
    "transformer_blocks.0.norm2.weight",
    "transformer_blocks.1.attn.to_q.weight",
    "transformer_blocks.1.norm2.weight",
    "proj_out.weight",
};

DtypeRule rule(const std::string& pattern, c10::ScalarType dtype, const std::string& source) {
  return {pattern, dtype, source, true};
}

}  // namespace

TEST_CASE("plan: defaults / ordered overrides / later rules win", "[precision][plan]") {
  const PrecisionPlan plan(at::kFloat, at::kFloat, at::kBFloat16,
                           {rule("*.norm2.*", at::kFloat, "r0"), rule("transformer_blocks.1.*", at::kHalf, "r1")});
  const CompiledPlan compiled = plan.compile(kNames);
  CHECK(compiled.entries().size() == kNames.size());
  CHECK(compiled.at("proj_out.weight").compute == at::kBFloat16);
  CHECK(compiled.at("proj_out.weight").rule == "default");
  CHECK(compiled.at("proj_out.weight").master == at::kFloat);
  CHECK(compiled.at("proj_out.weight").reduce == at::kFloat);
  CHECK(compiled.at("transformer_blocks.0.norm2.weight").compute == at::kFloat);
  CHECK(compiled.at("transformer_blocks.0.norm2.weight").rule == "r0");
  // Both rules match block 1's norm2: the later one wins.
  CHECK(compiled.at("transformer_blocks.1.norm2.weight").compute == at::kHalf);
  CHECK(compiled.at("transformer_blocks.1.norm2.weight").rule == "r1");
  CHECK(compiled.at("transformer_blocks.1.attn.to_q.weight").compute == at::kHalf);

  // Reversed order: the norm rule is now the later one.
  const CompiledPlan reversed =
      PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16,
                    {rule("transformer_blocks.1.*", at::kHalf, "r1"), rule("*.norm2.*", at::kFloat, "r0")})
          .compile(kNames);
  CHECK(reversed.at("transformer_blocks.1.norm2.weight").compute == at::kFloat);
  CHECK(reversed.at("transformer_blocks.1.norm2.weight").rule == "r0");
  // A later rule back to the default dtype is the rule that set it.
  const CompiledPlan back =
      PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16,
                    {rule("*.norm2.*", at::kFloat, "up"), rule("transformer_blocks.0.*", at::kBFloat16, "down")})
          .compile(kNames);
  CHECK(back.at("transformer_blocks.0.norm2.weight").compute == at::kBFloat16);
  CHECK(back.at("transformer_blocks.0.norm2.weight").rule == "down");
  CHECK(back.at("transformer_blocks.1.norm2.weight").rule == "up");
}

TEST_CASE("plan: a rule matching no parameter is an error naming it", "[precision][plan]") {
  const PrecisionPlan plan(at::kFloat, at::kFloat, at::kBFloat16,
                           {rule("*.norm2.*", at::kFloat, "precision.override[0] \"*.norm2.*\""),
                            rule("*.norm_q.*", at::kFloat, "precision.override[1] \"*.norm_q.*\"")});
  CHECK_THROWS_WITH(plan.compile(kNames), Contains("precision rule precision.override[1] \"*.norm_q.*\"") &&
                                              Contains("matches no parameter"));
  // A family default may name modules a preset lacks.
  DtypeRule optional = rule("*.norm_q.*", at::kFloat, "family default");
  optional.must_match = false;
  CHECK_NOTHROW(PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {optional}).compile(kNames));
  CHECK_THROWS_WITH(PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {rule("", at::kFloat, "empty")}),
                    Contains("empty pattern"));
}

TEST_CASE("plan: an override equal to the default compiles to nothing", "[precision][plan]") {
  const CompiledPlan plain = PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16).compile(kNames);
  const CompiledPlan same =
      PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {rule("*", at::kBFloat16, "all bf16")}).compile(kNames);
  for (const auto& [name, entry] : plain.entries()) {
    INFO(name);
    CHECK(same.at(name).compute == entry.compute);
    CHECK(same.at(name).rule == "default");
  }
  CHECK_THROWS_WITH(plain.at("not.a.parameter"), Contains("no parameter 'not.a.parameter'"));
}

TEST_CASE("plan: LoRA adapters follow their base unless a rule names them", "[precision][plan]") {
  std::vector<std::string> names = kNames;
  for (const std::string base : {"transformer_blocks.0.attn.to_q", "transformer_blocks.0.norm2"}) {
    names.push_back(base + ".lora_A.weight");
    names.push_back(base + ".lora_B.weight");
  }
  const CompiledPlan compiled = PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16,
                                              {rule("*.norm2.weight", at::kFloat, "norm rule"),
                                               rule("*.to_q.lora_B.*", at::kHalf, "lora_B rule")})
                                    .compile(names);
  // lora_A of norm2 is named by no rule: it inherits its base's dtype and rule.
  CHECK(compiled.at("transformer_blocks.0.norm2.lora_A.weight").compute == at::kFloat);
  CHECK(compiled.at("transformer_blocks.0.norm2.lora_A.weight").rule == "norm rule");
  CHECK(compiled.at("transformer_blocks.0.attn.to_q.lora_A.weight").compute == at::kBFloat16);
  CHECK(compiled.at("transformer_blocks.0.attn.to_q.lora_A.weight").rule == "default");
  CHECK(compiled.at("transformer_blocks.0.attn.to_q.lora_B.weight").compute == at::kHalf);
  CHECK(compiled.at("transformer_blocks.0.attn.to_q.lora_B.weight").rule == "lora_B rule");
}

TEST_CASE("plan: regression: a plan for a LoRA model resolves every PEFT-wrapped parameter name", "[precision][plan]") {
  // The seed compiled its wrap plan on the raw model and looked parameters
  // up by the PEFT model's names: KeyError on every LoRA run.
  std::vector<std::string> canonical = kNames;
  canonical.push_back("transformer_blocks.0.attn.to_q.lora_A.weight");
  canonical.push_back("transformer_blocks.0.attn.to_q.lora_B.weight");
  canonical.push_back("transformer_blocks.1.attn.to_q.lora_A.weight");
  canonical.push_back("transformer_blocks.1.attn.to_q.lora_B.weight");
  const PrecisionPlan plan(at::kFloat, at::kFloat, at::kBFloat16, {rule("*.norm2.*", at::kFloat, "norm rule")});
  std::vector<std::string> peft;
  for (const std::string& name : canonical) {
    const bool wrapped = name.find(".attn.to_q.") != std::string::npos;  // LoRA-wrapped base layers
    peft.push_back(peft_name(name, wrapped));
  }
  CHECK(peft[2] == "base_model.model.transformer_blocks.0.attn.to_q.base_layer.weight");
  CHECK(peft[8] == "base_model.model.transformer_blocks.0.attn.to_q.lora_A.default.weight");

  const CompiledPlan from_canonical = plan.compile(canonical);
  const CompiledPlan from_peft = plan.compile(peft);
  for (size_t i = 0; i < canonical.size(); ++i) {
    INFO(peft[i]);
    REQUIRE(from_canonical.contains(peft[i]));
    REQUIRE(from_peft.contains(canonical[i]));
    CHECK(from_canonical.at(peft[i]).compute == from_peft.at(canonical[i]).compute);
    CHECK(from_canonical.at(peft[i]).rule == from_peft.at(canonical[i]).rule);
  }
  CHECK(from_peft.at("base_model.model.transformer_blocks.0.norm2.weight").compute == at::kFloat);
  CHECK(from_peft.entries().count("transformer_blocks.0.attn.to_q.weight") == 1);
}

TEST_CASE("plan: from the deck's [precision] section / family rules first", "[precision][plan]") {
  const ditrl::config::Config config = ditrl::config::parse_deck(R"(
[model]
family = "sd3"
[precision]
forward = "fp16"
reduce = "bf16"
[[precision.override]]
pattern = "transformer_blocks.0.*"
dtype = "bf16"
)",
                                                                 "deck.toml");
  DtypeRule family = rule("*.norm2.*", at::kFloat, "family default \"*.norm2.*\"");
  family.must_match = false;
  const CompiledPlan compiled = ditrl::app::precision_plan(config, {family}).compile(kNames);
  CHECK(compiled.at("proj_out.weight").compute == at::kHalf);
  CHECK(compiled.at("proj_out.weight").reduce == at::kBFloat16);
  CHECK(compiled.at("transformer_blocks.1.norm2.weight").compute == at::kFloat);
  CHECK(compiled.at("transformer_blocks.0.norm2.weight").compute == at::kBFloat16);
  CHECK(compiled.at("transformer_blocks.0.norm2.weight").rule == "precision.override[0] \"transformer_blocks.0.*\"");

  ditrl::config::Config no_family = config;
  no_family.precision.family_overrides = false;
  CHECK(
      ditrl::app::precision_plan(no_family, {family}).compile(kNames).at("transformer_blocks.1.norm2.weight").compute ==
      at::kHalf);
}

TEST_CASE("input policy: default / fixed dtypes and passthrough casts", "[precision][plan]") {
  const at::Tensor latents = at::randn({2, 3});  // fp32
  const at::Tensor cond = at::randn({2, 4}, at::kDouble);
  const at::Tensor timestep = at::rand({2}).to(at::kHalf);
  const at::Tensor mask = at::ones({2, 4}, at::kLong);

  const InputPolicy deflt =
      InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, at::kBFloat16);
  CHECK(deflt.cast_latents(latents).scalar_type() == at::kBFloat16);
  CHECK(at::equal(deflt.cast_latents(latents), latents.to(at::kBFloat16)));
  CHECK(deflt.cast_cond(cond).scalar_type() == at::kBFloat16);
  CHECK(deflt.cast_timestep(timestep).scalar_type() == at::kHalf);  // passthrough keeps the caller's dtype
  CHECK(deflt.cast_timestep(timestep).is_same(timestep));
  CHECK(deflt.cast_cond(mask).scalar_type() == at::kLong);  // masks and indices are never cast
  CHECK_FALSE(deflt.cast_cond(at::Tensor()).defined());

  const InputPolicy fixed = InputPolicy::resolve(InputDtype::Fp32, InputDtype::Fp16, InputDtype::Bf16, at::kBFloat16);
  CHECK(fixed.cast_latents(latents).is_same(latents));  // already fp32: no copy
  CHECK(fixed.cast_cond(cond).scalar_type() == at::kHalf);
  CHECK(fixed.cast_timestep(timestep).scalar_type() == at::kBFloat16);

  const InputPolicy fp16_default =
      InputPolicy::resolve(InputDtype::Default, InputDtype::Passthrough, InputDtype::Fp32, at::kHalf);
  CHECK(fp16_default.cast_latents(latents).scalar_type() == at::kHalf);
  CHECK(fp16_default.cast_cond(cond).scalar_type() == at::kDouble);
  CHECK(fp16_default.cast_timestep(timestep).scalar_type() == at::kFloat);
}
