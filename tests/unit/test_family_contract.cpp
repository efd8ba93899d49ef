// The contract a family keeps on its reference fixture (tests/fixtures/<family>/),
// checked once for every family it applies to: fp32 cases with every
// intermediate, the bf16 case bit for bit, LoRA starting at the base output,
// and a checkpoint that does not fit refused with one error listing every problem (negative controls: each
// change to the fixture's weights must show up). Checks that belong to one
// family stay in test_<family>.cpp; LTX's fixtures (audio and video, two
// model generations) are checked in test_ltx.cpp.

#include <ditrl/error.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;

namespace {

// The fixture's weights with tensors dropped, renamed, reshaped (zeros of
// another shape) or added, and the parts of the error each change makes.
struct BadCheckpoint {
  std::vector<std::string> dropped;
  std::map<std::string, std::string> renamed;
  std::map<std::string, std::vector<int64_t>> reshaped;
  std::vector<std::pair<std::string, std::vector<int64_t>>> added;
  std::vector<std::string> error;    // in load_weights' error
  std::vector<std::string> inspect;  // in `ditrl inspect`'s output
};

// LoRA on the family's default targets: the options, how many adapters, and
// one adapter whose nonzero B must move the output.
struct LoraCase {
  int64_t seed;
  int64_t adapters;
  const char* moved;
};

struct sd3 {
  static constexpr const char* name = "sd3";
  // The tap records exactly the stored intermediates (SD3 has no parity dump points).
  static constexpr bool dump_points = false;
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {
        {"proj_out.bias", "norm_out.linear.bias"},
        {},
        {{"context_embedder.weight", {64, 33}}},
        {{"transformer_blocks.7.attn.to_q.weight", {2, 2}}},
        {"missing (2): norm_out.linear.bias, proj_out.bias", "unexpected (1): transformer_blocks.7.attn.to_q.weight",
         "wrong shape (1): context_embedder.weight (checkpoint [64, 33], model [64, 32])"},
        {"norm_out.linear.bias", "transformer_blocks.7.attn.to_q.weight",
         "context_embedder.weight (checkpoint [64, 33]"}};
  }
};

struct wan {
  static constexpr const char* name = "wan";
  static constexpr bool dump_points = true;
  // case_1: per-token timesteps (B, L), Wan2.2 TI2V.
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{},
            {{"blocks.1.attn2.to_k.weight", "blocks.1.attn2.to_kk.weight"}},
            {{"blocks.0.scale_shift_table", {1, 9, 64}}},
            {},
            {"missing (1): blocks.1.attn2.to_k.weight", "unexpected (1): blocks.1.attn2.to_kk.weight",
             "wrong shape (1): blocks.0.scale_shift_table (checkpoint [1, 9, 64], model [1, 6, 64])"},
            {"blocks.1.attn2.to_k.weight", "blocks.1.attn2.to_kk.weight",
             "blocks.0.scale_shift_table (checkpoint [1, 9, 64]"}};
  }
  // blocks x (attn1, attn2) x (to_q, to_k, to_v, to_out.0).
  static LoraCase lora() { return {5, 2 * 2 * 4, "blocks.0.attn2.to_v.lora_B.weight"}; }
};

struct qwen_image {
  static constexpr const char* name = "qwen_image";
  static constexpr bool dump_points = true;
  // case_1: padded text (mask), odd-height grid.
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{},
            {{"txt_in.weight", "txt_in.kernel"}},
            {{"transformer_blocks.1.attn.norm_added_q.weight", {64}}},
            {},
            {"missing (1): txt_in.weight", "unexpected (1): txt_in.kernel",
             "wrong shape (1): transformer_blocks.1.attn.norm_added_q.weight (checkpoint [64], model [32])"},
            {"txt_in.weight", "txt_in.kernel", "transformer_blocks.1.attn.norm_added_q.weight (checkpoint [64]"}};
  }
  // 12 targets per block (docs/families.md §4.8).
  static LoraCase lora() { return {0, 2 * 12, "transformer_blocks.0.txt_mlp.net.2.lora_B.weight"}; }
};

// The fixture's architecture, seeded init (on `device`).
std::shared_ptr<Family> fixture_architecture(const std::string& family, c10::Device device = c10::kCPU) {
  FamilyOptions o;
  o.family = family;
  o.config_json = fixture_path(family + "/config.json");
  o.device = device;
  return create_family(o);
}

std::string write_bad_checkpoint(const std::string& family, const BadCheckpoint& bad) {
  const io::SafetensorsFile weights(fixture_path(family + "/weights.safetensors"));
  io::NamedTensors tensors;
  for (const std::string& name : weights.names()) {
    if (std::find(bad.dropped.begin(), bad.dropped.end(), name) != bad.dropped.end()) continue;
    const auto renamed = bad.renamed.find(name);
    const auto reshaped = bad.reshaped.find(name);
    tensors.emplace_back(renamed != bad.renamed.end() ? renamed->second : name,
                         reshaped != bad.reshaped.end() ? at::zeros(reshaped->second) : weights.get(name));
  }
  for (const auto& [name, shape] : bad.added) tensors.emplace_back(name, at::zeros(shape));
  const std::string path = test::fresh_output_dir(family + "_bad_checkpoint") + "/bad.safetensors";
  io::write_safetensors(path, tensors);
  return path;
}

}  // namespace

TEMPLATE_TEST_CASE("family contract: fp32 fixture cases and every intermediate match the reference", "[models][family]",
                   sd3, wan, qwen_image) {
  const std::string family = TestType::name;
  auto model = test::fixture_family(family);
  for (const std::string& name : TestType::fp32_cases()) {
    INFO(family << "/" << name);
    const ReferenceCase c = load_reference_case(fixture_path(family + "/" + name + ".safetensors"));
    const auto out = run_reference_case(*model, c, /*intermediates=*/true);
    for (const auto& [key, value] : out) {
      INFO(key);
      CHECK((c.stored.count(key) == 1 || (TestType::dump_points && test::is_dump_point(key))));
    }
    test::check_fp32_tensors(family + "/" + name, out, c.stored, test::kFixtureFp32Ulps);
  }
}

TEMPLATE_TEST_CASE("family contract: bf16 fixture case with the fp32-kept parameters", "[models][family]", sd3, wan,
                   qwen_image) {
  // Every op runs at the reference's rounding points (docs/families.md, per
  // family), so the bf16 output is the reference's bit for bit (fixtures made
  // on the LibTorch ditrl links).
  auto model = test::fixture_family(TestType::name);
  test::check_bf16_fixture_case(*model, TestType::name);
}

TEMPLATE_TEST_CASE("family contract: a checkpoint that does not fit is one error listing every problem",
                   "[models][family]", sd3, wan, qwen_image) {
  const std::string family = TestType::name;
  const BadCheckpoint bad = TestType::bad_checkpoint();
  const std::string path = write_bad_checkpoint(family, bad);
  try {
    load_weights(*fixture_architecture(family), io::Checkpoint(path));
    FAIL("load_weights accepted " << path);
  } catch (const std::exception& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK_THAT(message, Contains(path));
    for (const std::string& part : bad.error) CHECK_THAT(message, Contains(part));
  }
  CHECK_THROWS_WITH(load_weights(*fixture_architecture(family, c10::kMeta),
                                 io::Checkpoint(fixture_path(family + "/weights.safetensors"))),
                    Contains("meta device"));

  const std::string config = fixture_path(family + "/config.json");
  const auto ok = test::run_process(fmt::format("{} inspect {} --family {} --config {}", DITRL_BINARY,
                                                fixture_path(family + "/weights.safetensors"), family, config));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("# matches family " + family));
  const auto refused =
      test::run_process(fmt::format("{} inspect {} --family {} --config {}", DITRL_BINARY, path, family, config));
  INFO(refused.output);
  CHECK(refused.exit_code != 0);
  for (const std::string& part : bad.inspect) CHECK_THAT(refused.output, Contains(part));
}

TEMPLATE_TEST_CASE("family contract: LoRA on the default targets starts at the base output", "[models][family][lora]",
                   wan, qwen_image) {
  const LoraCase lora = TestType::lora();
  FamilyOptions o;
  o.lora.enabled = true;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.seed = lora.seed;
  auto adapted = test::fixture_family(TestType::name, o);
  auto base = test::fixture_family(TestType::name);
  int64_t adapters = 0;
  for (const auto& p : adapted->named_parameters()) {
    const bool is_lora = p.key().find(".lora_") != std::string::npos;
    CHECK(p.value().requires_grad() == is_lora);
    adapters += is_lora && p.key().find("lora_A") != std::string::npos;
  }
  CHECK(adapters == lora.adapters);
  const ReferenceCase c = load_reference_case(fixture_path(std::string(TestType::name) + "/case_1.safetensors"));
  CHECK(
      at::equal(run_reference_case(*adapted, c, false).at("output"), run_reference_case(*base, c, false).at("output")));
  // A nonzero B moves the output (the negative control).
  {
    torch::NoGradGuard no_grad;
    adapted->named_parameters()[lora.moved].fill_(0.05);
  }
  CHECK_FALSE(
      at::equal(run_reference_case(*adapted, c, false).at("output"), run_reference_case(*base, c, false).at("output")));
}
