// Results that do not depend on the number of ranks (deterministic mode,
// rl/loss_window.hpp): the quickstart and every recipe proxy trained at 1, 2
// and 4 ranks give bitwise-equal metrics (perf/* aside) and checkpoints, and
// a run resumed at another rank count continues bitwise equal.
#include <ditrl/io/standard.hpp>

#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <filesystem>
#include <string>

using namespace ditrl;

namespace {

// The newest checkpoint of a run (step-<N>.h5 with the largest N).
std::string last_checkpoint(const std::string& out_dir) {
  std::string best;
  int64_t best_step = -1;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || entry.path().extension() != ".h5") continue;
    const int64_t step = std::stoll(name.substr(5));
    if (step > best_step) {
      best_step = step;
      best = entry.path().string();
    }
  }
  return best;
}

// Metrics bitwise (perf/* excluded) and the last checkpoint's /model and
// /optimizer bitwise (h5diff without tolerance compares the values exactly).
void check_same_run(const std::string& reference, const std::string& other) {
  INFO(other << " against " << reference);
  const std::string differ = test::differing_metrics(reference, other);
  INFO(differ);
  CHECK(differ.empty());
  const std::string a = last_checkpoint(reference), b = last_checkpoint(other);
  REQUIRE(!a.empty());
  CHECK(std::filesystem::path(a).filename() == std::filesystem::path(b).filename());
  for (const char* group : {"/model", "/optimizer"}) {
    const auto diff = test::run_process("h5diff " + a + " " + b + " " + group);
    INFO(diff.output);
    CHECK(diff.exit_code == 0);
  }
}

// Trains `deck` (relative to the source tree) for `rollouts` rollouts at 1,
// 2 and 4 ranks and checks the 2- and 4-rank runs against the 1-rank run.
// One rollout suffices: a different grouping of the gradient sums shows in
// the checkpoint's weights and moments, a metric's in its first row (the
// resume test below runs three). The GRPO decks run two, so that rollout/
// train parity is also checked on updated weights (issue 51: a LoRA run
// on an Intel Xeon with AMX first departed at rollout 1).
// Returns the 1-rank run's output directory.
std::string check_rank_counts(const std::string& name, const std::string& deck, int rollouts,
                              const std::string& extra = "") {
  const std::string path = std::string(DITRL_SOURCE_DIR) + "/" + deck;
  const std::string args = "--set train.num_rollouts=" + std::to_string(rollouts) + " " + extra;
  std::string reference;
  for (int ranks : {1, 2, 4}) {
    const std::string out = test::fresh_output_dir("ranks_" + name + "_" + std::to_string(ranks));
    const auto run = test::train(path, out, ranks, args);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    if (ranks == 1)
      reference = out;
    else
      check_same_run(reference, out);
  }
  return reference;
}

// A rollout's first optimizer step, before any update: the training
// forward reproduces the rollout's bit for bit.
void check_rollout_train_parity(const std::string& out) {
  const io::MetricsTable m = test::metrics_of(out);
  const std::vector<double>& step = m.series.at("rollout/step");
  for (size_t row = 0; row < step.size(); ++row)
    if (row == 0 || step[row] != step[row - 1]) {
      CHECK(m.series.at("train/log_prob_mean_abs_diff")[row] == 0.0);
      CHECK(m.series.at("train/model_output_max_abs_diff")[row] == 0.0);
    }
}

}  // namespace

TEST_CASE("ranks: the quickstart at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("quickstart", "inputs/quickstart.toml", 2));
}

TEST_CASE("ranks: proxy_sd3_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("sd3_grpo", "tests/standards/proxy_sd3_grpo.toml", 2));
}

TEST_CASE("ranks: proxy_sd3_nft at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rank_counts("sd3_nft", "tests/standards/proxy_sd3_nft.toml", 1);
}

TEST_CASE("ranks: proxy_qwen_image_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("qwen_image_grpo", "tests/standards/proxy_qwen_image_grpo.toml", 2));
}

TEST_CASE("ranks: proxy_flux1_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("flux1_grpo", "tests/standards/proxy_flux1_grpo.toml", 2));
}

TEST_CASE("ranks: proxy_flux2_klein_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("flux2_klein_grpo", "tests/standards/proxy_flux2_klein_grpo.toml", 2));
}

TEST_CASE("ranks: proxy_wan22_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("wan22_grpo", "tests/standards/proxy_wan22_grpo.toml", 2));
}

TEST_CASE("ranks: proxy_wan22_sft at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rank_counts("wan22_sft", "tests/standards/proxy_wan22_sft.toml", 1);
}

TEST_CASE("ranks: proxy_ltx23_grpo at 1 2 4 ranks is bitwise equal", "[e2e][ranks]") {
  check_rollout_train_parity(check_rank_counts("ltx23_grpo", "tests/standards/proxy_ltx23_grpo.toml", 2));
}

TEST_CASE(
    "ranks: proxy_sd3_grpo on the CPU flash attention kernel in fp32 and bf16 at 1 2 4 ranks is bitwise equal / with "
    "rollout-train parity",
    "[e2e][ranks][parity]") {
  // bf16: the half kernel's forward, the widened fp32 backward at these sizes.
  for (const std::string forward : {"fp32", "bf16"}) {
    CAPTURE(forward);
    const std::string out = check_rank_counts("sd3_grpo_flash_" + forward, "tests/standards/proxy_sd3_grpo.toml", 2,
                                              "--set precision.attention=flash --set precision.forward=" + forward);
    check_rollout_train_parity(out);
  }
}

TEST_CASE(
    "ranks: proxy_sd3_grpo at 16x16 on oneDNN's fp32 GEMMs at 1 2 4 ranks is bitwise equal / with rollout-train "
    "parity",
    "[e2e][ranks][parity]") {
  // 16x16 latents: 64 image tokens, so the layers' products reach the 2^20
  // multiply-adds from which linear takes oneDNN (models/widened_gemm.cpp).
  const std::string out =
      check_rank_counts("sd3_grpo_onednn", "tests/standards/proxy_sd3_grpo.toml", 2,
                        "--set precision.cpu_fp32_gemm=onednn --set rollout.height=16 --set rollout.width=16");
  check_rollout_train_parity(out);
  CHECK_THAT(test::metrics_of(out).cpu, Catch::Matchers::EndsWith("; cpu_fp32_gemm=onednn"));
  const std::string log = test::read_file(out + "/logs/rank-0.log");
  CHECK_THAT(log, Catch::Matchers::Contains("fp32 GEMMs on the CPU: oneDNN's matmul"));
}

// The deck a user found non-invariant on an Intel Xeon with AMX under the old
// MKL_CBWR=AVX2 pin (issue 51: LoRA r8, CFG, micro-batch 2, 2 rollouts; lp
// diff 2.98e-8 at rollout 1's first step on 2 ranks, 24 of 36 series off the
// 1-rank run), swept over forward precision, LoRA on and off and latent
// shapes: every run at 1, 2 and 4 ranks bitwise equal, and every rollout's
// first step reproduces the rollout forward (rollout 1 runs on updated
// weights, where the LoRA products are no longer zero).
TEST_CASE(
    "ranks: proxy_sd3_grpo swept over fp32 / bf16 - LoRA / full - 8x8 / 16x8 / 24x24 latents at 1 2 4 ranks is bitwise "
    "equal / with rollout-train parity at every rollout",
    "[e2e][ranks][parity]") {
  struct Variant {
    std::string forward, lora, height, width;
  };
  const Variant variants[] = {{"fp32", "true", "8", "8"},  {"fp32", "false", "8", "8"}, {"bf16", "true", "8", "8"},
                              {"bf16", "false", "8", "8"}, {"fp32", "true", "16", "8"}, {"fp32", "true", "24", "24"}};
  for (const Variant& v : variants) {
    const std::string name =
        "sd3_sweep_" + v.forward + (v.lora == "true" ? "_lora_" : "_full_") + v.height + "x" + v.width;
    CAPTURE(name);
    const std::string out =
        check_rank_counts(name, "tests/standards/proxy_sd3_grpo.toml", 2,
                          "--set precision.forward=" + v.forward + " --set model.lora.enabled=" + v.lora +
                              " --set rollout.height=" + v.height + " --set rollout.width=" + v.width);
    check_rollout_train_parity(out);
  }
}

TEST_CASE("ranks: a run stopped at 4 ranks and resumed at 2 continues the 1-rank run bitwise", "[e2e][ranks][resume]") {
  // NFT: the EMA old policy is per-parameter state that reshards with the moments.
  const std::string deck = std::string(DITRL_SOURCE_DIR) + "/tests/standards/proxy_sd3_nft.toml";
  const std::string args = "--set train.num_rollouts=3";
  const std::string whole = test::fresh_output_dir("ranks_resume_whole");
  const std::string split = test::fresh_output_dir("ranks_resume_split");
  REQUIRE(test::train(deck, whole, 1, args).exit_code == 0);
  REQUIRE(test::train(deck, split, 4, args + " --max-rollouts 1").exit_code == 0);
  const auto resumed = test::train(deck, split, 2, args + " --resume latest");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  check_same_run(whole, split);
}
