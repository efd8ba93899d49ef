// The main job as users run it: `mpiexec -np 2 ditrl train DECK`, its
// metrics, checkpoints, resume (same and other rank counts), failures and
// signals.
#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/standard.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "corrupt.hpp"
#include "e2e.hpp"

#include <sched.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

using namespace ditrl;
using Catch::Matchers::Contains;
using test::data_offset;
using test::flip_byte;
using test::read_file;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");

}  // namespace

TEST_CASE("train: a 2-rank run writes metrics / checkpoints and reproduces the rollout forward exactly",
          "[e2e][train]") {
  const std::string out = test::fresh_output_dir("e2e_basic");
  const auto r = test::train(kDeck, out, 2, "--set train.num_rollouts=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("rollout 2/2"));
  CHECK(read_file(out + "/status") == "complete\n");
  CHECK(std::filesystem::exists(out + "/checkpoints/step-2.h5"));
  CHECK(read_file(out + "/checkpoints/latest") == "step-2.h5\n");
  CHECK(std::filesystem::exists(out + "/logs/rank-1.log"));

  const io::MetricsTable m = test::metrics_of(out);
  CHECK(m.steps == std::vector<int64_t>{0, 1});
  // Same binary, same kernels, same micro-batch composition: at every
  // rollout's first optimizer step (weights not yet updated) the training
  // forward equals the rollout forward bit for bit.
  for (size_t row : {0, 1}) {
    CHECK(m.series.at("train/log_prob_mean_abs_diff")[row] == 0.0);
    CHECK(m.series.at("train/model_output_mean_abs_diff")[row] == 0.0);
    CHECK(m.series.at("train/model_output_max_abs_diff")[row] == 0.0);
    CHECK(m.series.at("train/ratio_abs_minus_1")[row] == 0.0);
  }
  CHECK(std::isfinite(m.series.at("train/grad_norm")[0]));
  CHECK(m.series.at("rollout/reward/raw_num_samples")[0] == 8.0);
  CHECK(m.series.count("perf/peak_device_bytes") == 0);  // a GPU run's allocator peak
  const auto dump = test::run_process("h5dump -A " + out + "/checkpoints/step-2.h5");
  CHECK(dump.exit_code == 0);
  CHECK_THAT(dump.output, Contains("ditrl-checkpoint-2"));
}

TEST_CASE("train: a rank runs no more intra-op threads than the cores it is bound to", "[e2e][train]") {
  // taskset binds mpiexec and so its rank to one core (--bind-to none keeps
  // Open MPI's own binding out of it); unbound, one rank takes every core it may use.
  const auto threads_of = [](const std::string& launcher, const std::string& out) {
    const auto r =
        test::run_process(fmt::format("{} {} --bind-to none -np 1 {} train {} --set run.out_dir={} "
                                      "--set run.deterministic=false --max-rollouts 1",
                                      launcher, DITRL_MPIEXEC, DITRL_BINARY, kDeck, out));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const std::string log = read_file(out + "/logs/rank-0.log");
    const size_t at = log.find(") threads ");
    REQUIRE(at != std::string::npos);
    return std::stoi(log.substr(at + 10));
  };
  CHECK(threads_of("taskset -c 0", test::fresh_output_dir("e2e_threads_bound")) == 1);
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof(mine), &mine) == 0);
  CHECK(threads_of("", test::fresh_output_dir("e2e_threads_unbound")) ==
        std::min<int>(CPU_COUNT(&mine), static_cast<int>(std::thread::hardware_concurrency())));
}

TEST_CASE("train: stopping after rollout 2 of 4 and resuming gives the uninterrupted run bit for bit",
          "[e2e][resume]") {
  const std::string a = test::fresh_output_dir("e2e_resume_a"), b = test::fresh_output_dir("e2e_resume_b");
  REQUIRE(test::train(kDeck, a, 2).exit_code == 0);
  const auto first = test::train(kDeck, b, 2, "--max-rollouts 2");
  REQUIRE(first.exit_code == 0);
  CHECK(read_file(b + "/status") == "preempted\n");
  const auto second = test::train(kDeck, b, 2, "--resume latest");
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, Contains("resumed from " + b + "/checkpoints/step-2.h5"));

  const io::Standard uninterrupted = io::make_standard(test::metrics_of(a), "");
  CHECK(io::check_standard(uninterrupted, test::metrics_of(b)).empty());
  const auto diff = test::run_process("h5diff " + a + "/checkpoints/step-4.h5 " + b + "/checkpoints/step-4.h5 /model");
  CHECK(diff.exit_code == 0);
  const auto moments =
      test::run_process("h5diff " + a + "/checkpoints/step-4.h5 " + b + "/checkpoints/step-4.h5 /optimizer");
  CHECK(moments.exit_code == 0);
}

TEST_CASE(
    "train: keeping units gathered across a rollout's steps / or every block's graph until backward / "
    "changes no metric",
    "[e2e][rollout][shard]") {
  const std::string base = test::fresh_output_dir("e2e_keep_base");
  REQUIRE(test::train(kDeck, base, 2, "--max-rollouts 2").exit_code == 0);
  const io::Standard expected = io::make_standard(test::metrics_of(base), "");
  for (const std::string setting : {"parallel.rollout_keep_gathered=true", "parallel.recompute=false"}) {
    INFO(setting);
    const std::string out = test::fresh_output_dir("e2e_keep_variant");
    const auto run = test::train(kDeck, out, 2, "--max-rollouts 2 --set " + setting);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(io::check_standard(expected, test::metrics_of(out)).empty());
    for (const char* group : {" /model", " /optimizer"})
      CHECK(test::run_process("h5diff " + base + "/checkpoints/step-2.h5 " + out + "/checkpoints/step-2.h5" + group)
                .exit_code == 0);
  }
}

TEST_CASE("train: corrupted and truncated checkpoints are named / and the previous one still loads",
          "[e2e][checkpoint]") {
  const std::string out = test::fresh_output_dir("e2e_corrupt");
  REQUIRE(test::train(kDeck, out, 2, "--set train.num_rollouts=2").exit_code == 0);
  const std::string step2 = out + "/checkpoints/step-2.h5";
  const std::string dataset = "/model/transformer_blocks.0.attn.to_q.weight";
  flip_byte(step2, data_offset(step2, dataset));
  const auto flipped = test::train(kDeck, out, 2, "--set train.num_rollouts=3 --resume " + step2);
  CHECK(flipped.exit_code != 0);
  CHECK_THAT(flipped.output, Contains("is corrupted: reading " + dataset));

  std::filesystem::resize_file(step2, std::filesystem::file_size(step2) / 2);
  const auto truncated = test::train(kDeck, out, 2, "--set train.num_rollouts=3 --resume " + step2);
  CHECK(truncated.exit_code != 0);
  CHECK_THAT(truncated.output, Contains("cannot be opened"));

  const auto previous =
      test::train(kDeck, out, 2, "--set train.num_rollouts=3 --resume " + out + "/checkpoints/step-1.h5");
  INFO(previous.output);
  CHECK(previous.exit_code == 0);
  CHECK_THAT(previous.output, Contains("rollout 3/3"));
}

TEST_CASE("train: a rank killed in the middle of a checkpoint leaves `latest` loadable", "[e2e][checkpoint]") {
  const std::string out = test::fresh_output_dir("e2e_kill");
  const auto killed = test::train(kDeck, out, 2, "", "DITRL_TEST_KILL_IN_CHECKPOINT=1:2");
  CHECK(killed.exit_code != 0);
  CHECK(read_file(out + "/checkpoints/latest") == "step-1.h5\n");
  CHECK_FALSE(std::filesystem::exists(out + "/checkpoints/step-2.h5"));
  const auto resumed = test::train(kDeck, out, 2, "--resume latest");
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + out + "/checkpoints/step-1.h5"));
  CHECK_THAT(resumed.output, Contains("rollout 4/4"));
}

TEST_CASE("train: SIGTERM checkpoints at the next safe point and exits 0", "[e2e][signal]") {
  const std::string out = test::fresh_output_dir("e2e_sigterm");
  // The job runs in the background; once its first rollout is logged, each of
  // its ranks (the ditrl children of this job's mpiexec, no other process on
  // the machine) gets SIGTERM, as Slurm sends it to a step's tasks.
  const std::string script = out + "/sigterm.sh";
  std::ofstream(script) << fmt::format(
      "{} -np 2 {} train {} --set run.out_dir={} --set train.num_rollouts=200 --set checkpoint.every=0 > {}/job.log "
      "2>&1 &\njob=$!\nfor i in $(seq 600); do grep -q 'rollout 1/200' {}/job.log && break; sleep 0.1; done\n"
      "echo signalled=$(pkill -TERM -e -P $job -x ditrl | wc -l)\nwait $job\necho exit=$?\n",
      DITRL_MPIEXEC, DITRL_BINARY, kDeck, out, out, out);
  const auto r = test::run_process("timeout 300 bash " + script);
  INFO(r.output << read_file(out + "/job.log"));
  CHECK_THAT(r.output, Contains("signalled=2"));
  CHECK_THAT(r.output, Contains("exit=0"));
  CHECK(read_file(out + "/status") == "preempted\n");
  CHECK_THAT(read_file(out + "/job.log"), Contains("signal 15 received"));
  REQUIRE(std::filesystem::exists(out + "/checkpoints/latest"));
  const size_t done = test::metrics_of(out).steps.size();
  CHECK(done < 200);
  // The preempted run resumes from its boundary checkpoint and goes on.
  const auto resumed = test::train(
      kDeck, out, 2, fmt::format("--set train.num_rollouts={} --set checkpoint.every=0 --resume latest", done + 1));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + out + "/checkpoints/"));
  CHECK_THAT(resumed.output, Contains(fmt::format("rollout {}/{}", done + 1, done + 1)));
  CHECK(test::metrics_of(out).steps.size() == done + 1);
  CHECK(read_file(out + "/status") != "preempted\n");
}

TEST_CASE("train: bad decks fail before any rank does work", "[e2e][deck]") {
  const std::string out = test::fresh_output_dir("e2e_bad");
  const auto invariant = test::train(kDeck, out + "/a", 2, "--set train.global_batch=6");
  CHECK(invariant.exit_code != 0);
  CHECK_THAT(invariant.output, Contains("batch-knob invariant"));
  const auto family = test::train(kDeck, out + "/b", 2, "--set model.family=sd4");
  CHECK(family.exit_code != 0);
  CHECK_THAT(family.output, Contains("'model.family' = \"sd4\" is out of range"));
  const auto weights = test::train(kDeck, out + "/c", 2, "--set model.weights=/nonexistent/w.safetensors");
  CHECK(weights.exit_code != 0);
  CHECK_THAT(weights.output, Contains("model.weights = \"/nonexistent/w.safetensors\": no such file"));
  const auto ranks = test::train(kDeck, out + "/d", 3, "");
  CHECK(ranks.exit_code != 0);
  CHECK_THAT(ranks.output, Contains("train.global_batch = 8 is not divisible by the 3 ranks"));
  // `ditrl plan` predicts ~3.3 TB per rank (attention scores of 262144 tokens): refused before loading.
  const auto memory =
      test::train(kDeck, out + "/e", 2, "--set model.family=wan --set rollout.height=1024 --set rollout.width=1024");
  CHECK(memory.exit_code != 0);
  CHECK_THAT(memory.output, Contains("GB per rank (`ditrl plan`'s predicted peak") && Contains("this node has") &&
                                Contains("run.check_memory = false to start anyway"));
  CHECK_THAT(memory.output, !Contains("[load]"));
  for (const char* d : {"a", "b", "c", "d", "e"}) CHECK_FALSE(std::filesystem::exists(out + "/" + d + "/metrics.h5"));
}

TEST_CASE("train: wrong or partial weights fail before any work naming the tensor", "[e2e][deck][weights]") {
  const std::string out = test::fresh_output_dir("e2e_bad_weights");
  // The deck's own model, whole, as a weights file; then one defect each.
  const io::NamedTensors good =
      models::state_tensors(*app::deck_model(config::parse_deck(read_file(kDeck), kDeck), c10::kCPU));
  const auto broken = [&](const std::string& name, const std::function<void(io::NamedTensors&)>& edit) {
    io::NamedTensors tensors = good;
    edit(tensors);
    const std::string path = out + "/" + name + ".safetensors";
    io::write_safetensors(path, tensors);
    return path;
  };
  const auto at_name = [](io::NamedTensors& t, const std::string& name) -> at::Tensor& {
    for (auto& [key, value] : t)
      if (key == name) return value;
    throw Error("no tensor " + name);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {broken("missing",
              [](io::NamedTensors& t) {
                t.erase(std::remove_if(t.begin(), t.end(), [](const auto& x) { return x.first == "proj_out.bias"; }),
                        t.end());
              }),
       "missing (1): proj_out.bias"},
      {broken("unexpected", [](io::NamedTensors& t) { t.emplace_back("extra.weight", at::zeros({3})); }),
       "unexpected (1): extra.weight"},
      {broken("shape",
              [&](io::NamedTensors& t) {
                at_name(t, "context_embedder.weight") = at::zeros({2, 2});
              }),
       "wrong shape (1): context_embedder.weight (checkpoint [2, 2]"},
      {broken("dtype",
              [&](io::NamedTensors& t) {
                at::Tensor& v = at_name(t, "norm_out.linear.weight");
                v = v.to(at::kLong);
              }),
       "norm_out.linear.weight (I64)"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [path, message] = cases[i];
    INFO(path);
    const std::string run = out + "/run" + std::to_string(i);
    const auto r = test::train(kDeck, run, 2, "--set model.weights=" + path);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Contains(message) && Contains(path));
    CHECK_FALSE(std::filesystem::exists(run + "/metrics.h5"));
    CHECK_FALSE(std::filesystem::exists(run + "/checkpoints"));
  }
  // The same file whole trains: the defects, not the file's form, failed.
  const auto fine = test::train(kDeck, out + "/good", 2,
                                "--set train.num_rollouts=1 --set model.weights=" + broken("good", [](auto&) {}));
  INFO(fine.output);
  CHECK(fine.exit_code == 0);
}

TEST_CASE("train: rollouts written by `ditrl rollout` train like sampled ones / bad files are named",
          "[e2e][rollout]") {
  const std::string out = test::fresh_output_dir("e2e_traj");
  const std::string traj = out + "/rollout-0.h5";
  const auto rollout = test::run_process(fmt::format("{} -np 2 {} rollout {} --out {} --set run.out_dir={}",
                                                     DITRL_MPIEXEC, DITRL_BINARY, kDeck, traj, out));
  INFO(rollout.output);
  REQUIRE(rollout.exit_code == 0);
  const auto from_file = test::train(kDeck, out + "/file", 2,
                                     "--set train.num_rollouts=1 --trajectories " + out + "/rollout-{rollout}.h5");
  INFO(from_file.output);
  REQUIRE(from_file.exit_code == 0);
  const auto sampled = test::train(kDeck, out + "/sampled", 2, "--set train.num_rollouts=1");
  REQUIRE(sampled.exit_code == 0);
  const io::MetricsTable a = test::metrics_of(out + "/file"), b = test::metrics_of(out + "/sampled");
  for (const char* key : {"train/loss", "train/grad_norm", "rollout/reward/raw_mean", "train/log_prob_mean_abs_diff"})
    CHECK(a.series.at(key) == b.series.at(key));

  {  // an external engine's file with a wrongly shaped latent array
    io::h5::File f = io::h5::File::open(traj, io::h5::File::Mode::ReadWrite);
    H5Ldelete(f.id(), "log_probs", H5P_DEFAULT);
    f.create_dataset("log_probs", at::kFloat, {8, 3});
  }
  const auto bad = test::train(kDeck, out + "/bad", 2, "--set train.num_rollouts=1 --trajectories " + traj);
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("trajectories " + traj + ": log_probs has shape [8, 3], expected [8, 2]"));
}

TEST_CASE("export: a checkpoint's weights as a diffusers model folder / a LoRA run's as PEFT and diffusers files",
          "[e2e][export]") {
  const std::string out = test::fresh_output_dir("e2e_export");
  REQUIRE(test::train(kDeck, out, 2, "--set train.num_rollouts=1").exit_code == 0);
  const std::string ckpt = out + "/checkpoints/step-1.h5";
  const auto r = test::ditrl("export " + ckpt + " --out " + out + "/export");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  io::Checkpoint exported(out + "/export/diffusion_pytorch_model.safetensors");
  io::h5::File file = io::h5::File::open(ckpt);
  for (const std::string& name : file.open_group("/model").children())
    CHECK(at::equal(exported.get(name), file.open_dataset("/model/" + name).read()));
  CHECK(exported.contains("pos_embed.pos_embed"));  // the persistent buffer, which no checkpoint dataset holds
  CHECK_THAT(read_file(out + "/export/config.json"), Contains("\"_class_name\":\"SD3Transformer2DModel\""));
  const auto inspect = test::ditrl("inspect " + out + "/export/diffusion_pytorch_model.safetensors --family sd3");
  CHECK(inspect.exit_code == 0);

  // Above --max-shard-size: shards and an index, which ditrl reads back as one checkpoint.
  const auto sharded = test::ditrl("export " + ckpt + " --out " + out + "/export --max-shard-size 200KB");
  INFO(sharded.output);
  REQUIRE(sharded.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(out + "/export/diffusion_pytorch_model.safetensors"));  // the stale single file
  io::Checkpoint index(out + "/export/diffusion_pytorch_model.safetensors.index.json");
  CHECK(index.files().size() > 1);
  CHECK(index.names() == exported.names());
  const auto bad = test::ditrl("export " + ckpt + " --out " + out + "/x --max-shard-size 10XB");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("--max-shard-size: '10XB' is not a positive size"));

  const std::string lora = test::fresh_output_dir("e2e_export_lora");
  REQUIRE(test::train(kDeck, lora, 2,
                      "--set train.num_rollouts=1 --set model.lora.enabled=true --set model.lora.rank=4 "
                      "--set model.lora.alpha=6 --set train.kl_beta=0.01")
              .exit_code == 0);
  const auto rl = test::ditrl("export " + lora + "/checkpoints/step-1.h5 --out " + lora + "/export --merged");
  INFO(rl.output);
  REQUIRE(rl.exit_code == 0);
  // PEFT's saved form: no adapter name in the keys, r and lora_alpha in adapter_config.json.
  io::Checkpoint peft(lora + "/export/adapter_model.safetensors");
  CHECK(peft.contains("base_model.model.transformer_blocks.0.attn.to_q.lora_A.weight"));
  const std::string config = read_file(lora + "/export/adapter_config.json");
  CHECK_THAT(config, Contains("\"peft_type\":\"LORA\"") && Contains("\"r\":4") && Contains("\"lora_alpha\":6") &&
                         Contains("\"transformer_blocks.0.attn.to_q\""));
  // diffusers: transformer.-prefixed keys, alpha where load_lora_weights reads it.
  io::Checkpoint diffusers(lora + "/export/pytorch_lora_weights.safetensors");
  CHECK(diffusers.contains("transformer.transformer_blocks.0.attn.to_q.lora_B.weight"));
  CHECK_THAT(diffusers.metadata().at("lora_adapter_metadata"), Contains("\"transformer.lora_alpha\":6"));
  // ComfyUI: its SD3 key map's diffusers names, alpha as a tensor beside each module.
  io::Checkpoint comfyui(lora + "/export/comfyui_lora.safetensors");
  CHECK(comfyui.contains("transformer.transformer_blocks.0.attn.to_q.lora_B.weight"));
  CHECK(comfyui.get("transformer.transformer_blocks.0.attn.to_q.alpha").item<double>() == 6.0);
  CHECK(comfyui.names().size() == diffusers.names().size() / 2 * 3);
  // The deck's weights are a local file: no path of this machine in the adapter's config.
  CHECK_THAT(config, Contains("\"base_model_name_or_path\":null"));
  CHECK(std::filesystem::exists(lora + "/export/merged/config.json"));

  // The merged values: base + (alpha / r) B A for every adapted weight, the
  // base itself elsewhere. The base is the merged export of the same deck
  // with no update (B starts at zero, so nothing is added to it).
  const std::string base = test::fresh_output_dir("e2e_export_lora_base");
  REQUIRE(test::train(kDeck, base, 2,
                      "--set train.num_rollouts=1 --set model.lora.enabled=true --set model.lora.rank=4 "
                      "--set model.lora.alpha=6 --set train.kl_beta=0.01 --set debug.skip_optimizer_step=true")
              .exit_code == 0);
  REQUIRE(test::ditrl("export " + base + "/checkpoints/step-1.h5 --out " + base + "/export --merged").exit_code == 0);
  io::Checkpoint merged(lora + "/export/merged/diffusion_pytorch_model.safetensors");
  io::Checkpoint bare(base + "/export/merged/diffusion_pytorch_model.safetensors");
  io::h5::File trained = io::h5::File::open(lora + "/checkpoints/step-1.h5");
  REQUIRE(merged.names() == bare.names());
  int64_t adapted = 0;
  for (const std::string& name : merged.names()) {
    INFO(name);
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const std::string module = weight ? name.substr(0, name.size() - 7) : name;
    const std::string a = "/model/" + module + ".lora_A.weight", b = "/model/" + module + ".lora_B.weight";
    if (!weight || !trained.exists(a)) {
      CHECK(at::equal(merged.get(name), bare.get(name)));
      continue;
    }
    const at::Tensor lora_b = trained.open_dataset(b).read();
    // An adapter without gradient (the last block's context queries feed
    // nothing) keeps B = 0 and merges to the base exactly.
    if (lora_b.abs().max().item<float>() == 0) {
      CHECK(at::equal(merged.get(name), bare.get(name)));
      continue;
    }
    ++adapted;
    const at::Tensor expected = bare.get(name) + at::matmul(lora_b, trained.open_dataset(a).read()) * (6.0 / 4.0);
    // fp32 rounding of a 4-term sum, whatever kernel: a few ulps of the values.
    const double ulp =
        std::nextafter(expected.abs().max().item<float>(), INFINITY) - expected.abs().max().item<float>();
    CHECK((merged.get(name) - expected).abs().max().item<double>() <= 4 * ulp);
    CHECK_FALSE(at::equal(merged.get(name), bare.get(name)));
  }
  CHECK(adapted >= 4 * 4);  // trained adapters: every block's image-side attention projections at least
  const auto merged_full = test::ditrl("export " + out + "/checkpoints/step-1.h5 --out " + out + "/y --merged");
  CHECK(merged_full.exit_code != 0);
  CHECK_THAT(merged_full.output, Contains("is a full fine-tune"));
}

TEST_CASE("export: a two-expert Wan2.2 run writes each expert into its pipeline component folder", "[e2e][export]") {
  const std::string out = test::fresh_output_dir("e2e_export_a14b");
  const std::string deck = std::string(DITRL_SOURCE_DIR) + "/tests/standards/proxy_wan22_grpo.toml";
  const auto trained = test::train(deck, out, 2, "--set train.num_rollouts=1");
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const auto r = test::ditrl("export " + out + "/checkpoints/step-1.h5 --out " + out + "/export --merged");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const std::string expert : {"transformer", "transformer_2"}) {
    INFO(expert);
    // Names as each expert's own checkpoint: no transformer./transformer_2. expert prefix.
    io::Checkpoint diffusers(out + "/export/" + expert + "/pytorch_lora_weights.safetensors");
    CHECK(diffusers.contains("transformer.blocks.0.attn1.to_q.lora_A.weight"));
    io::Checkpoint peft(out + "/export/" + expert + "/adapter_model.safetensors");
    CHECK(peft.contains("base_model.model.blocks.1.ffn.net.2.lora_B.weight"));
    // ComfyUI: Wan's checkpoint names, an alpha per module.
    io::Checkpoint comfyui(out + "/export/" + expert + "/comfyui_lora.safetensors");
    CHECK(comfyui.contains("diffusion_model.blocks.0.self_attn.q.lora_A.weight"));
    CHECK(comfyui.contains("diffusion_model.blocks.1.ffn.2.lora_B.weight"));
    CHECK(comfyui.contains("diffusion_model.blocks.1.ffn.2.alpha"));
    CHECK(std::filesystem::exists(out + "/export/" + expert + "/adapter_config.json"));
    const std::string merged = out + "/export/merged/" + expert + "/diffusion_pytorch_model.safetensors";
    CHECK(test::ditrl("inspect " + merged + " --family wan").exit_code == 0);
    CHECK_THAT(read_file(out + "/export/merged/" + expert + "/config.json"),
               Contains("\"_class_name\":\"WanTransformer3DModel\""));
  }
  // The two experts were trained apart: their adapters differ.
  CHECK_FALSE(at::equal(io::Checkpoint(out + "/export/transformer/adapter_model.safetensors")
                            .get("base_model.model.blocks.0.attn1.to_q.lora_B.weight"),
                        io::Checkpoint(out + "/export/transformer_2/adapter_model.safetensors")
                            .get("base_model.model.blocks.0.attn1.to_q.lora_B.weight")));
}

// `ditrl check` promises what train refuses in its first seconds: both refuse
// the same unusable out_dirs, with the same words, printed once.
TEST_CASE("train: check and train refuse the same unusable out_dirs - naming them once", "[e2e][train]") {
  const std::string base = test::fresh_output_dir("e2e_bad_out_dirs");
  std::filesystem::create_directories(base + "/status_dir/status");
  std::filesystem::create_directories(base + "/latest_dir/checkpoints/latest");
  std::filesystem::create_directories(base + "/checkpoints_file");
  std::ofstream(base + "/checkpoints_file/checkpoints") << "not a folder";
  struct Case {
    std::string out_dir, expected;
  };
  const Case cases[] = {
      {"'\"" + base + "/a\\u0000b\"'", "holds a NUL character at byte " + std::to_string(base.size() + 2)},
      {"/proc/ditrl-out", "/proc does not take new entries"},
      {base + "/status_dir", base + "/status_dir/status is not a regular file"},
      {base + "/latest_dir", base + "/latest_dir/checkpoints/latest is not a regular file"},
      {base + "/checkpoints_file", base + "/checkpoints_file/checkpoints is not a folder"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.out_dir);
    const auto checked = test::ditrl("check " + kDeck + " --set run.out_dir=" + c.out_dir);
    CHECK(checked.exit_code != 0);
    CHECK_THAT(checked.output, Contains(c.expected));
    const auto trained = test::train(kDeck, base + "/unused", 1, "--set run.out_dir=" + c.out_dir);
    CHECK(trained.exit_code != 0);
    CHECK_THAT(trained.output, Contains(c.expected));
    const size_t first = trained.output.find(c.expected);
    CHECK(trained.output.find(c.expected, first + 1) == std::string::npos);
  }
  // Negative control: a fresh folder under the same base passes both.
  CHECK(test::ditrl("check " + kDeck + " --set run.out_dir=" + base + "/fresh").exit_code == 0);
}

TEST_CASE("train: an unknown --set section is named by its --set argument / printed once", "[e2e][train]") {
  const auto r = test::ditrl("check " + kDeck + " --set rolout.steps=4");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains("(--set rolout.steps=4)") && !Contains("<deck>"));
  const size_t first = r.output.find("invalid deck");
  REQUIRE(first != std::string::npos);
  CHECK(r.output.find("invalid deck", first + 1) == std::string::npos);
}

TEST_CASE("train: a run resumed past train.num_rollouts says there is nothing to train", "[e2e][train]") {
  const std::string out = test::fresh_output_dir("e2e_nothing_to_train");
  REQUIRE(test::train(kDeck, out, 1, "--set train.num_rollouts=2").exit_code == 0);
  const auto r = test::train(kDeck, out, 1, "--set train.num_rollouts=1 --resume latest");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("nothing to train: the run resumed at rollout 2 and train.num_rollouts is 1"));
  CHECK_THAT(r.output, !Contains("training complete: -"));
}
