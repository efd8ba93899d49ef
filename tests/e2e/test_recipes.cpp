// The recipe decks under inputs/: each passes `ditrl check` and `ditrl plan`
// at its real preset (no weights are loaded, so the USER paths need not
// exist), and each recipe has a tiny proxy whose e2e standard CI checks.
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <filesystem>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kSource = DITRL_SOURCE_DIR;

std::vector<std::filesystem::path> input_decks() {
  std::vector<std::filesystem::path> decks;
  for (const auto& entry : std::filesystem::directory_iterator(kSource + "/inputs"))
    if (entry.path().extension() == ".toml") decks.push_back(entry.path());
  std::sort(decks.begin(), decks.end());
  return decks;
}

// A 2-rank run of tests/standards/<name>.toml checked against <name>.json.
void check_standard(const std::string& name) {
  const std::string dir = kSource + "/tests/standards/";
  const std::string out = test::fresh_output_dir("standard_" + name);
  const auto run = test::train(dir + name + ".toml", out, 2);
  INFO(name << "\n" << run.output);
  REQUIRE(run.exit_code == 0);
  const auto check = test::ditrl("standard check " + out + " " + dir + name + ".json");
  INFO(check.output);
  CHECK(check.exit_code == 0);
  CHECK_THAT(check.output, Contains("standard met"));
}

}  // namespace

TEST_CASE("recipes: every deck in inputs/ passes check --without-files and plan without its weights", "[e2e][recipe]") {
  const std::vector<std::filesystem::path> decks = input_decks();
  REQUIRE(decks.size() >= 6);
  for (const auto& deck : decks) {
    const std::string stem = deck.stem().string();
    INFO(deck.string());
    const auto check = test::ditrl("check --without-files " + deck.string());
    INFO(check.output);
    CHECK(check.exit_code == 0);
    const auto plan = test::ditrl("plan " + deck.string() + " --ranks 8");
    INFO(plan.output);
    CHECK(plan.exit_code == 0);
    CHECK_THAT(plan.output, Contains("over 8 ranks"));
    if (stem == "quickstart") continue;
    // Without --without-files, check names the weights train would not find.
    const auto staged = test::ditrl("check " + deck.string());
    CHECK(staged.exit_code != 0);
    CHECK_THAT(staged.output, Contains("model.weights = \"") && Contains("no such file"));
    // A recipe runs at its released checkpoint's size, reads weights the
    // user names, and has a tiny proxy with a committed standard.
    CHECK_THAT(check.output, !Contains("preset = 'tiny'"));
    // [model] weights (not [model.lora] weights, an optional adapter to start from).
    const size_t model = check.output.find("[model]\n");
    REQUIRE(model != std::string::npos);
    const std::string model_section = check.output.substr(model, check.output.find("\n\n", model) - model);
    CHECK_THAT(model_section, !Contains("weights = ''"));
    CHECK(std::filesystem::exists(kSource + "/tests/standards/proxy_" + stem + ".toml"));
    CHECK(std::filesystem::exists(kSource + "/tests/standards/proxy_" + stem + ".json"));
  }
}

TEST_CASE("recipes: a recipe deck with an unknown key or a broken batch invariant is refused", "[e2e][recipe]") {
  const std::string deck = kSource + "/inputs/sd3_grpo.toml";
  const auto typo = test::ditrl("check " + deck + " --set rollout.guidance=4.5");
  CHECK(typo.exit_code != 0);
  CHECK_THAT(typo.output, Contains("rollout.guidance"));
  const auto batch = test::ditrl("plan " + deck + " --set train.global_batch=500");
  CHECK(batch.exit_code != 0);
  CHECK_THAT(batch.output, Contains("batch-knob invariant"));
}

TEST_CASE("recipes: SD3.5 Flow-GRPO proxy reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_sd3_grpo");
}

TEST_CASE("recipes: SD3.5 DiffusionNFT proxy reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_sd3_nft");
}

TEST_CASE("recipes: Qwen-Image Flow-GRPO proxy reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_qwen_image_grpo");
}

TEST_CASE("recipes: Wan2.2 two-expert Flow-GRPO proxy reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_wan22_grpo");
}

TEST_CASE("recipes: Wan2.2 two-expert LoRA SFT proxy reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_wan22_sft");
}

TEST_CASE("recipes: LTX-2.3 CPS Flow-GRPO proxy (bf16 forward) reproduces its standard", "[e2e][standard][recipe]") {
  check_standard("proxy_ltx23_grpo");
}
