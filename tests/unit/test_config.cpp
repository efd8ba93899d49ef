#include <ditrl/config/deck.hpp>
#include <ditrl/cuda_build.hpp>
#include <ditrl/error.hpp>

#include <catch2/catch.hpp>

#include "process.hpp"

#include <fstream>

using Catch::Matchers::Contains;
using ditrl::config::Config;
using ditrl::config::parse_deck;

namespace {

const char* kMinimal = R"(
[model]
family = "sd3"
)";

// The message parse_deck throws for `text`, or "" when it parses.
std::string deck_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_deck(text, "deck.toml", overrides);
  } catch (const ditrl::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: a minimal deck gets every default", "[config]") {
  const Config c = parse_deck(kMinimal, "deck.toml");
  CHECK(c.model.family == "sd3");
  CHECK(c.model.preset == "tiny");
  CHECK(c.precision.master == c10::ScalarType::Float);
  CHECK(c.precision.forward == c10::ScalarType::BFloat16);
  CHECK(c.precision.inputs.timestep == ditrl::precision::InputDtype::Passthrough);
  CHECK(c.rollout.steps == 10);
  CHECK_FALSE(c.rollout.shift.has_value());
  CHECK(c.train.betas == std::vector<double>{0.9, 0.999});
  CHECK(c.run.seed == 42);
}

TEST_CASE("config: unknown key names file:line:col and suggests the closest key", "[config]") {
  const std::string error = deck_error("[model]\nfamily = \"sd3\"\n\n[rollout]\nstpes = 20\n");
  CHECK_THAT(error, Contains("deck.toml:5:1"));
  CHECK_THAT(error, Contains("unknown key 'rollout.stpes'"));
  CHECK_THAT(error, Contains("did you mean 'rollout.steps'?"));
}

TEST_CASE("config: unknown section suggests the closest section", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) + "\n[rolout]\nsteps = 3\n");
  CHECK_THAT(error, Contains("unknown key 'rolout'"));
  CHECK_THAT(error, Contains("did you mean 'rollout'?"));
}

TEST_CASE("config: an unknown key with nothing close lists the known keys", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) + "\n[metrics]\nxyzzy_plugh = 1\n");
  CHECK_THAT(error, Contains("unknown key 'metrics.xyzzy_plugh'"));
  CHECK_THAT(error, Contains("known keys here: every"));
}

TEST_CASE("config: wrong type names key / expected type and location", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) + "[train]\nlr = \"fast\"\n");
  CHECK_THAT(error, Contains("deck.toml:5:6"));
  CHECK_THAT(error, Contains("'train.lr' must be a number, got a string"));
}

TEST_CASE("config: integers are accepted for number keys but not the reverse", "[config]") {
  CHECK(parse_deck(std::string(kMinimal) + "[train]\nclip_grad = 2\n", "d").train.clip_grad == 2.0);
  CHECK_THAT(deck_error(std::string(kMinimal) + "[rollout]\nsteps = 2.5\n"),
             Contains("'rollout.steps' must be a integer, got a number"));
}

TEST_CASE("config: out-of-range values name key / value and range", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) + "[rollout]\nsteps = 0\n");
  CHECK_THAT(error, Contains("deck.toml:5:9"));
  CHECK_THAT(error, Contains("'rollout.steps' = 0 is out of range: expected a value in [1, 1000]"));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[train]\nlr = -1e-4\n"), Contains("expected a finite value > 0"));
}

TEST_CASE("config: numbers must be finite and fit fp32 / timeouts must fit a deadline", "[config]") {
  const auto with = [](const std::string& section, const std::string& assignment) {
    return deck_error(std::string(kMinimal) + "[" + section + "]\n" + assignment + "\n");
  };
  // A value that passed check and then stopped the run after the model load
  // ("value cannot be converted to type float without overflow") or NaN'd it.
  CHECK_THAT(with("train", "lr = 1e300"), Contains("'train.lr' = 1e+300 is out of range: expected a finite value > 0 "
                                                   "within fp32's range"));
  CHECK_THAT(with("train", "clip_range = inf"), Contains("'train.clip_range' = inf is out of range"));
  CHECK_THAT(with("rollout", "shift = nan"), Contains("'rollout.shift' = nan is out of range"));
  CHECK_THAT(with("model.lora", "alpha = inf"), Contains("'model.lora.alpha' = inf is out of range"));
  CHECK(with("train", "lr = 3e38").empty());
  // A huge timeout overflowed the deadline and ended the job at once as if a peer hung.
  CHECK_THAT(with("parallel", "startup_timeout_s = 1e12"),
             Contains("'parallel.startup_timeout_s' = 1000000000000 is out of range: expected a value > 0 and <= "
                      "1000000000"));
  CHECK_THAT(with("parallel", "collective_timeout_s = inf"), Contains("'parallel.collective_timeout_s' = inf"));
  CHECK_THAT(with("reward", "timeout_s = 1e10"), Contains("'reward.timeout_s' = 10000000000 is out of range"));
  CHECK(with("parallel", "collective_timeout_s = 1e9").empty());
}

TEST_CASE("config: a value outside a fixed set lists the choices", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) + "[precision]\nforward = \"fp8\"\n");
  CHECK_THAT(error,
             Contains("'precision.forward' = \"fp8\" is out of range: expected one of \"fp32\", \"bf16\", \"fp16\""));
}

TEST_CASE("config: array elements are type- and range-checked", "[config]") {
  CHECK_THAT(deck_error(std::string(kMinimal) + "[train]\nbetas = [0.9, 1.5]\n"),
             Contains("'train.betas' = 1.5 is out of range"));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[train]\nbetas = 0.9\n"),
             Contains("'train.betas' must be a array of numbers, got a number"));
}

TEST_CASE("config: a missing required key is an error", "[config]") {
  CHECK_THAT(deck_error("[run]\nseed = 1\n"), Contains("missing required key 'model.family' (string)"));
  CHECK_THAT(deck_error("[model]\n[[precision.override]]\ndtype = \"fp32\"\n"),
             Contains("missing required key 'precision.override[0].pattern'"));
}

TEST_CASE("config: every problem of a deck is reported at once", "[config]") {
  const std::string error = deck_error("[model]\nfamily = \"sd3\"\nprest = \"x\"\n[train]\nlr = 0\n");
  CHECK_THAT(error, Contains("2 problems"));
  CHECK_THAT(error, Contains("model.prest"));
  CHECK_THAT(error, Contains("train.lr"));
}

TEST_CASE("config: TOML syntax errors carry a location", "[config]") {
  CHECK_THAT(deck_error("[model\nfamily = 1\n"), Contains("deck.toml:1:"));
  CHECK_THAT(deck_error("[model\nfamily = 1\n"), Contains("TOML syntax error"));
}

TEST_CASE("config: --set overrides go through the same checks", "[config]") {
  const Config c = parse_deck(kMinimal, "deck.toml",
                              {"rollout.steps=20", "model.preset=medium", "train.betas=[0.8, 0.99]",
                               "precision.inputs.latents=fp32", "run.deterministic=true"});
  CHECK(c.rollout.steps == 20);
  CHECK(c.model.preset == "medium");  // a bare word is taken as a string
  CHECK(c.train.betas == std::vector<double>{0.8, 0.99});
  CHECK(c.precision.inputs.latents == ditrl::precision::InputDtype::Fp32);
  CHECK(c.run.deterministic);

  const std::string range = deck_error(kMinimal, {"rollout.steps=0"});
  CHECK_THAT(range, Contains("(--set rollout.steps=0)"));
  CHECK_THAT(range, Contains("out of range"));
  CHECK_THAT(deck_error(kMinimal, {"rollout.stesp=3"}), Contains("did you mean 'rollout.steps'?"));
  CHECK_THAT(deck_error(kMinimal, {"train.lr=fast"}), Contains("'train.lr' must be a number, got a string"));
  CHECK_THAT(deck_error(kMinimal, {"novalue"}), Contains("expected section.key=value"));
  CHECK_THAT(deck_error(kMinimal, {"model.family.x=1"}), Contains("'family' is not a section"));
}

TEST_CASE("config: the effective deck round-trips through TOML text", "[config]") {
  const std::string deck = R"(
[run]
name = "round trip"
seed = 7
[model]
family = "wan"
weights_2 = "b.safetensors"
[model.lora]
enabled = true
targets = ["*.to_q", "*.to_k"]
[precision]
forward = "fp32"
[[precision.override]]
pattern = "*.norm2.*"
dtype = "fp32"
[[precision.override]]
pattern = "blocks.0.*"
dtype = "bf16"
[rollout]
shift = 5.0
guidance_scale = 4.0
guidance_scale_2 = 3.0
window = [0, 4]
[train]
lr = 3e-5
clip_range = 1e-5
)";
  const Config first = parse_deck(deck, "deck.toml");
  const std::string text = ditrl::config::to_toml(first);
  const Config second = parse_deck(text, "effective.toml");
  CHECK(ditrl::config::to_toml(second) == text);
  CHECK(second.precision.overrides.size() == 2);
  CHECK(second.precision.overrides[1].pattern == "blocks.0.*");
  CHECK(second.rollout.shift.value() == 5.0);
  CHECK(second.rollout.guidance_scale_2.value() == 3.0);
  CHECK(second.train.lr == 3e-5);
  CHECK(second.train.clip_range == 1e-5);
  CHECK(second.model.lora.targets == std::vector<std::string>{"*.to_q", "*.to_k"});
  CHECK(second.run.name == "round trip");
}

TEST_CASE("config: the batch-knob invariant is checked up front", "[config]") {
  const std::string error = deck_error(std::string(kMinimal) +
                                       "[rollout]\nbatch = 3\nsamples_per_prompt = 4\n"
                                       "[train]\nglobal_batch = 8\nsteps_per_rollout = 1\n");
  CHECK_THAT(error, Contains("batch-knob invariant"));
  CHECK_THAT(error, Contains("3 x 4 = 12 but 8 x 1 = 8"));
  CHECK(deck_error(std::string(kMinimal) + "[rollout]\nbatch = 3\nsamples_per_prompt = 4\n"
                                           "[train]\nglobal_batch = 6\nsteps_per_rollout = 2\n")
            .empty());
}

TEST_CASE("config: section rules report the offending key", "[config]") {
  CHECK_THAT(deck_error("[model]\nfamily = \"ltx\"\n[rollout]\nguidance_scale = 4.0\n"),
             Contains("LTX trains unguided"));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[rollout]\nwindow = [5, 3]\n"),
             Contains("'rollout.window' must be [lo, hi)"));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[rollout]\nstrategy = \"epoch_global_random_choice\"\n"),
             Contains("'rollout.candidate_steps' is required"));
  // Both passed check and failed in the first rollout.
  CHECK_THAT(deck_error(std::string(kMinimal) + "[rollout]\nsde_steps = 0\n"),
             Contains("'rollout.sde_steps' must be >= 1 for strategy \"sde_window\" with sde = \"sde\""));
  CHECK(deck_error(std::string(kMinimal) + "[rollout]\nsde_steps = 0\nsde = \"ode\"\n").empty());
  CHECK(deck_error(std::string(kMinimal) + "[rollout]\nsde_steps = 0\nstrategy = \"ode_and_return_last\"\n").empty());
  CHECK_THAT(deck_error(std::string(kMinimal) +
                        "[rollout]\nstrategy = \"epoch_global_random_choice\"\ncandidate_steps = [1, 3, 1]\n"),
             Contains("'rollout.candidate_steps' lists step 1 twice"));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[rollout]\nsde = \"cps\"\nnoise_level = 1.5\n"),
             Contains("'rollout.noise_level' = 1.5 must be in (0, 1] for sde = \"cps\""));
  CHECK_THAT(deck_error(std::string(kMinimal) + "[reward]\nkind = \"torchscript\"\n"),
             Contains("'reward.module' is required"));
  if (!ditrl::kCudaBuild) {
    CHECK_THAT(deck_error(std::string(kMinimal) + "[precision]\nattention = \"efficient\"\n"),
               Contains("runs on CUDA only"));
    CHECK_THAT(deck_error(std::string(kMinimal) + "[run]\ndevice = \"cuda\"\n"),
               Contains("'run.device' = \"cuda\" needs a CUDA build of ditrl"));
  }
  CHECK_THAT(deck_error(std::string(kMinimal) + "[run]\ndevice = \"gpu\"\n"), Contains("run.device"));
  // LibTorch's SDPA dispatcher refuses its cuDNN kernel under deterministic algorithms.
  CHECK_THAT(deck_error(std::string(kMinimal) + "[precision]\nattention = \"cudnn\"\n", {"run.deterministic=true"}),
             Contains("'precision.attention' = \"cudnn\" has no deterministic kernel"));
}

TEST_CASE("config: `ditrl check` prints the effective deck / or the problem and exits non-zero", "[config][cli]") {
  const std::string dir = ditrl::test::fresh_output_dir("config_cli");
  const std::string good = dir + "/good.toml", bad = dir + "/bad.toml";
  std::ofstream(good) << kMinimal;
  std::ofstream(bad) << "[model]\nfamily = \"sd3\"\n[train]\nlearning_rate = 1e-4\n";

  const auto ok = ditrl::test::run_process(std::string(DITRL_BINARY) + " check " + good + " --set rollout.steps=12");
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("steps = 12"));
  CHECK_THAT(ok.output, Contains("family = 'sd3'"));

  const auto failed = ditrl::test::run_process(std::string(DITRL_BINARY) + " check " + bad);
  CHECK(failed.exit_code != 0);
  CHECK_THAT(failed.output, Contains(bad + ":4:1"));
  CHECK_THAT(failed.output, Contains("unknown key 'train.learning_rate'"));

  const auto missing = ditrl::test::run_process(std::string(DITRL_BINARY) + " check " + dir + "/absent.toml");
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.output, Contains("cannot open deck"));
}

TEST_CASE("config: `ditrl check` rejects what train start would: batch splits / preset / geometry / out_dir",
          "[config][cli]") {
  const std::string dir = ditrl::test::fresh_output_dir("config_check_start");
  const std::string good = dir + "/good.toml";
  std::ofstream(good) << kMinimal;
  const std::string check = std::string(DITRL_BINARY) + " check " + good;

  const auto two = ditrl::test::run_process(check + " --ranks 2 --set run.out_dir=" + dir + "/run");
  INFO(two.output);
  CHECK(two.exit_code == 0);

  const auto three = ditrl::test::run_process(check + " --ranks 3 --set run.out_dir=" + dir + "/run");
  CHECK(three.exit_code != 0);
  CHECK_THAT(three.output, Contains("train.global_batch = 8 is not divisible by the 3 ranks"));

  // NFT: each sample gives 9 pairs (10 steps x 0.99), so micro-batches of 8
  // pairs take chunks of 8 samples; a rank's window holds 4 at 2 ranks, 8 at 1.
  const std::string nft =
      check + " --set train.loss=nft --set train.micro_batch=8 --set rollout.microgroup=1 --set run.out_dir=" + dir +
      "/run";
  const auto whole = ditrl::test::run_process(nft + " --ranks 1");
  INFO(whole.output);
  CHECK(whole.exit_code == 0);
  const auto split = ditrl::test::run_process(nft + " --ranks 2");
  CHECK(split.exit_code != 0);
  CHECK_THAT(split.output, Contains("holds 4 samples (train.global_batch / ranks), not whole chunks of 8 samples"));

  // `check` with `settings` exits non-zero with `message`.
  const auto refused = [&](const std::string& settings, const std::string& message) {
    const auto r = ditrl::test::run_process(check + " " + settings + " --set run.out_dir=" + dir);
    INFO(settings);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Contains(message));
  };
  refused("--set model.preset=nonesuch", "nonesuch");
  // These passed check and failed only after the model was built.
  refused("--set checkpoint.resume=" + dir + "/absent.h5",
          "checkpoint.resume = \"" + dir + "/absent.h5\": no such file");
  refused("--set data.sft_latents=" + dir + "/absent.h5", "data.sft_latents = \"" + dir + "/absent.h5\": no such file");
  // Both failed after the first rollout: "grpo pairs: the rollout has no SDE step to train".
  for (const char* ode : {"--set rollout.sde=ode", "--set rollout.strategy=ode_and_return_last"})
    refused(ode, "train.loss = \"grpo\" trains on the rollout's SDE steps");

  const auto out_dir = ditrl::test::run_process(check + " --set run.out_dir=" + good + "/run");
  CHECK(out_dir.exit_code != 0);
  CHECK_THAT(out_dir.output, Contains("is not a folder"));

  // The quickstart's geometry rules: what its first forward would refuse.
  const std::string quickstart = std::string(DITRL_BINARY) + " check " + DITRL_SOURCE_DIR + "/inputs/quickstart.toml";
  const auto odd = ditrl::test::run_process(quickstart + " --set rollout.height=17 --set run.out_dir=" + dir);
  CHECK(odd.exit_code != 0);
  CHECK_THAT(odd.output, Contains("must be multiples of patch_size 2"));
  const auto huge = ditrl::test::run_process(quickstart + " --set rollout.height=4096 --set run.out_dir=" + dir);
  CHECK(huge.exit_code != 0);
  CHECK_THAT(huge.output, Contains("the latent grid rollout.frames x rollout.height x rollout.width = 1x4096x8: ") &&
                              Contains("exceeds pos_embed_max_size"));
  const auto groups = ditrl::test::run_process(quickstart + " --set rollout.microgroup=32 --set run.out_dir=" + dir);
  CHECK(groups.exit_code != 0);
  CHECK_THAT(groups.output,
             Contains("do not split into micro-groups of 32 (rollout.microgroup, else train.micro_batch)"));
}
