#pragma once

// The deck's sections (docs/design.md §5). Each section lists its keys once in
// fields(), with what each one means, and checks its cross-key rules in
// validate(); the subsystem that consumes a section owns its rules. Defaults
// are the values a user gets when a key is absent and are printed by `ditrl
// check`; `ditrl deck-reference` prints every key's type, default, range and
// meaning from fields() (docs/deck-reference.md). A meaning is one phrase for
// a user; comments beside the members say why and where the value is used.

#include <ditrl/config/schema.hpp>
#include <ditrl/diffusion/sde_type.hpp>
#include <ditrl/models/attention_backend.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/precision/dtype_names.hpp>
#include <ditrl/rl/algorithm_traits.hpp>
#include <ditrl/rl/step_strategy.hpp>
#include <ditrl/rollout/reward_kind.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::config {

// Reports a cross-key problem at the key's deck location.
class Checker {
 public:
  Checker(Diagnostics& diag, const SourceMap& sources, std::string section)
      : diag_(diag), sources_(sources), section_(std::move(section)) {}
  void error(const std::string& key, const std::string& message) const;

 private:
  Diagnostics& diag_;
  const SourceMap& sources_;
  std::string section_;
};

constexpr double kIntMax = 9.0e15;  // keeps integer ranges exact in a double
// Timeouts become std::chrono nanosecond deadlines, which a larger value would overflow.
constexpr double kTimeoutMax = 1.0e9;

struct RunSection {
  std::string name = "ditrl";
  std::string out_dir = "out";
  int64_t seed = 42;
  bool deterministic = false;
  // The canonical tree is shard/grad_reduce.hpp's; it costs extra partial
  // gradient slices per rank (benchmarks/results/rank_invariance.md).
  bool rank_invariant = true;
  int64_t threads = 0;
  std::string log_level = "info";
  std::string device = "auto";
  bool check_memory = true;  // app/memory_check.hpp

  template <class V>
  void fields(V& v) {
    v("name", name, "a label for the run, stored with the deck in its metrics and checkpoints");
    v("out_dir", out_dir, "the run's folder: metrics.h5, checkpoints/, logs/, status (Slurm's scripts set their own)");
    v("seed", seed, "seeds the rollout noise, the choice of SDE steps and the losses' noise", Between{0, kIntMax});
    v("deterministic", deterministic,
      "bitwise-reproducible metrics and checkpoints: pins the CPU kernels (MKL_CBWR, ATen's CPU capability) and "
      "LibTorch's deterministic CUDA algorithms");
    v("rank_invariant", rank_invariant,
      "with deterministic: sum each optimizer step's micro-batch gradients in one canonical tree, so every "
      "power-of-two rank count gives the same bits; false: the sequential sum, bitwise at one rank count only");
    v("threads", threads,
      "intra-op threads per rank; 0 = the node's cores divided among its ranks, at most the rank's bound cores "
      "(1 in deterministic mode)",
      Between{0, 4096});
    v("log_level", log_level, "the least severe message the rank logs keep",
      OneOf{"trace", "debug", "info", "warn", "error"});
    v("device", device, "where a rank computes; \"auto\": its GPU on a CUDA build that sees one, else the CPU",
      OneOf{"auto", "cpu", "cuda"});
    v("check_memory", check_memory,
      "refuse to start when `ditrl plan`'s predicted peak per rank exceeds the memory the rank can have");
  }
  void validate(const Checker& c) const;
};

struct LoraSection {
  bool enabled = false;
  int64_t rank = 32;
  double alpha = 64.0;
  std::vector<std::string> targets;
  std::string init = "gaussian";
  std::string weights;  // models/lora_files.hpp reads each of its formats

  template <class V>
  void fields(V& v) {
    v("enabled", enabled, "train LoRA adapters only; the base weights stay frozen (the KL reference is adapters off)");
    v("rank", rank, "r, the adapters' rank", Between{1, 65536});
    v("alpha", alpha, "the adapters' scale is alpha / rank", Above{0});
    v("targets", targets,
      "the linear layers to adapt: module paths or globs, also matched as a path's tail; empty = the family's "
      "defaults");
    v("init", init, "how A is drawn (B starts at 0): \"gaussian\" N(0, 1/r), \"kaiming\" PEFT's kaiming-uniform",
      OneOf{"gaussian", "kaiming"});
    v("weights", weights,
      "start from an existing adapter instead of the init: a PEFT folder, a diffusers, ComfyUI or LTX-2 LoRA file "
      "(its rank, alpha and modules must be the deck's)");
  }
};

// model.family's choices: the families of the registry (models/family_traits.hpp).
inline OneOf family_choices() {
  OneOf choices{};
  choices.values = models::deck_family_names();
  return choices;
}

struct ModelSection {
  std::string family;
  std::string preset = "tiny";
  std::string config;
  std::string weights;
  std::string weights_2;
  int64_t init_seed = 0;
  LoraSection lora;

  template <class V>
  void fields(V& v) {
    v.required("family", family, "the model family", family_choices());
    v("preset", preset, "the family's architecture preset (a released checkpoint's, or \"tiny\" for tests)");
    v("config", config, "a diffusers config.json whose architecture overrides the preset's; empty = the preset");
    v("weights", weights,
      "the transformer's weights: a safetensors file or a sharded `*.index.json` (flux, flux2: also Black Forest "
      "Labs' single file); empty = the seeded init");
    v("weights_2", weights_2, "Wan2.2 A14B's second (low-noise) expert, `transformer_2/`; empty = one expert");
    v("init_seed", init_seed, "seeds the initial weights without a weights file, and the LoRA init",
      Between{0, kIntMax});
    v.table("lora", lora, "LoRA adapters: whether the run trains them instead of the whole model, and how.");
  }
  void validate(const Checker& c) const;
};

struct OverrideRule {
  std::string pattern;
  c10::ScalarType dtype = c10::ScalarType::Float;

  template <class V>
  void fields(V& v) {
    v.required("pattern", pattern, "a glob over the parameter names it applies to");
    v.required("dtype", dtype, "the dtype those parameters keep", precision::kDtypeNames);
  }
};

struct InputPolicySection {
  using InputDtype = precision::InputDtype;
  InputDtype latents = InputDtype::Default;
  InputDtype cond = InputDtype::Default;
  InputDtype timestep = InputDtype::Passthrough;

  template <class V>
  void fields(V& v) {
    const auto& policy = precision::kInputDtypeNames;
    v("latents", latents, "dtype the latents enter the model in; \"default\" = the forward dtype", policy);
    v("cond", cond, "dtype of the prompt conditioning; \"default\" = the forward dtype", policy);
    v("timestep", timestep, "dtype of the timestep or sigma; \"default\" = the forward dtype", policy);
  }
};

struct PrecisionSection {
  c10::ScalarType master = c10::ScalarType::Float;
  c10::ScalarType reduce = c10::ScalarType::Float;
  c10::ScalarType forward = c10::ScalarType::BFloat16;
  models::AttentionBackend attention = models::AttentionBackend::Math;
  std::string cpu_half_gemm = "auto";  // precision/cpu_half_gemm.hpp
  std::string cpu_fp32_gemm = "auto";  // precision/cpu_fp32_gemm.hpp
  std::vector<OverrideRule> overrides;
  bool family_overrides = true;
  InputPolicySection inputs;

  template <class V>
  void fields(V& v) {
    const auto& dtype = precision::kDtypeNames;
    v("master", master, "dtype of the master weights, AdamW moments and checkpoints", dtype);
    v("reduce", reduce, "dtype of the gradient reduce-scatter", dtype);
    v("forward", forward, "compute dtype of the forward and backward", dtype);
    v("attention", attention,
      "attention kernel: \"math\" ditrl's own, \"flash\" LibTorch's flash kernel (CPU too); \"efficient\" and "
      "\"cudnn\": CUDA only",
      models::kAttentionNames);
    v("cpu_half_gemm", cpu_half_gemm,
      "how bf16/fp16 GEMMs run on a CPU: \"widened\" to fp32 GEMMs, \"native\" LibTorch's; \"auto\" widens unless "
      "the CPU has AVX512-BF16 or AMX-BF16",
      OneOf{"auto", "native", "widened"});
    v("cpu_fp32_gemm", cpu_fp32_gemm,
      "which kernel runs fp32 GEMMs on a CPU; \"auto\" takes oneDNN's for large products unless the run is "
      "deterministic or the CPU is Intel's",
      OneOf{"auto", "blas", "onednn"});
    v.tables("override", overrides,
             "Parameters kept in another dtype than the forward's, one table per rule, applied in order after the "
             "family's defaults; each rule must match a parameter.");
    v("family_overrides", family_overrides, "apply the family's default fp32-kept parameters before the deck's rules");
    v.table("inputs", inputs,
            "The dtypes the model's inputs are cast to before the forward; \"passthrough\" keeps an input's own.");
  }
  void validate(const Checker& c) const;
};

struct ParallelSection {
  bool reshard_after_forward = true;
  bool prefetch = true;
  bool rollout_keep_gathered = false;
  bool recompute = true;
  double startup_timeout_s = 300;
  double collective_timeout_s = 100;
  int64_t sequence_parallel = 1;
  // Parsed into dist::DataBackend by app/options.cpp; "mpi" on a GPU is the
  // host-staged communicator (dist/communicator.hpp), which lets ranks share a GPU.
  std::string data_backend = "auto";

  template <class V>
  void fields(V& v) {
    v("reshard_after_forward", reshard_after_forward,
      "free each unit's gathered parameters after its forward; false keeps them until its backward");
    v("prefetch", prefetch, "gather the next unit's parameters while the current one computes");
    v("rollout_keep_gathered", rollout_keep_gathered,
      "keep the gathered units resident across a rollout's denoising steps (more memory, fewer gathers)");
    v("recompute", recompute,
      "recompute each block in backward (activation checkpointing); false keeps every block's activations from "
      "the forward");
    v("startup_timeout_s", startup_timeout_s,
      "seconds MPI and NCCL start-up may take before the watchdog ends the job naming the missing ranks",
      Above{0, kTimeoutMax});
    v("collective_timeout_s", collective_timeout_s,
      "seconds one collective may wait before the watchdog ends the job naming the ranks that did not reach it",
      Above{0, kTimeoutMax});
    v("sequence_parallel", sequence_parallel,
      "ranks that share one sample, its tokens split across them (Ulysses; wan and ltx); divides the world size "
      "and the attention heads",
      Between{1, 65536});
    v("data_backend", data_backend,
      "what carries parameters and gradients between GPUs: \"nccl\", or \"mpi\" through pinned host memory "
      "(slower; lets several ranks share one GPU); \"auto\" is NCCL on a GPU; CPU runs always use MPI",
      OneOf{"auto", "nccl", "mpi"});
  }
};

struct RolloutSection {
  int64_t steps = 10;
  std::optional<double> shift;
  diffusion::SdeType sde = diffusion::SdeType::Sde;
  double noise_level = 0.7;
  double guidance_scale = 1.0;
  std::optional<double> guidance_scale_2;
  std::optional<double> true_cfg_scale;
  bool negative_prompt = false;
  int64_t samples_per_prompt = 4;
  int64_t batch = 2;
  rl::StepStrategy strategy = rl::StepStrategy::SdeWindow;
  int64_t sde_steps = 1;
  std::vector<int64_t> window;
  std::vector<int64_t> candidate_steps;
  double timestep_fraction = 0.99;
  int64_t height = 16;
  int64_t width = 16;
  int64_t frames = 1;
  double fps = 24.0;
  int64_t microgroup = 0;

  template <class V>
  void fields(V& v) {
    v("steps", steps, "denoising steps per sample", Between{1, 1000});
    v("shift", shift, "static timestep shift of the schedule; absent = the family preset's schedule", Above{0});
    v("sde", sde,
      "sampling kernel on the SDE steps: \"sde\" Flow-SDE, \"cps\" coefficients-preserving; \"ode\" samples no SDE "
      "step",
      diffusion::kSdeNames);
    v("noise_level", noise_level,
      "the SDE's noise scale (eta); for \"cps\" the noise angle in units of pi/2, in (0, 1]", Between{0, 10});
    v("guidance_scale", guidance_scale,
      "classifier-free guidance scale (1 = unguided); Wan2.2 A14B: the high-noise expert's; FLUX.2-dev: the scale its "
      "guidance embedding takes (no CFG)",
      Between{0, 100});
    v("guidance_scale_2", guidance_scale_2, "Wan2.2 A14B: the low-noise expert's guidance scale", Between{0, 100});
    v("true_cfg_scale", true_cfg_scale,
      "true CFG scale (> 1: guided); Qwen-Image: rescaled to the positive prediction's norm; FLUX.2-dev: plain CFG "
      "beside the embedded guidance_scale",
      Between{0, 100});
    v("negative_prompt", negative_prompt,
      "declares a negative prompt (guided runs take the prompt data's negative embedding either way); LTX refuses "
      "it");
    v("samples_per_prompt", samples_per_prompt, "G, the samples of one prompt: the group its advantages compare",
      Between{1, 4096});
    v("batch", batch, "prompts per rollout (a rollout samples batch x samples_per_prompt)", Between{1, 1 << 20});
    v("strategy", strategy,
      "which steps are SDE (trained) steps: a seeded window per rollout, candidate steps drawn per epoch, or none "
      "(ODE only, for NFT and SFT)",
      rl::kStepStrategyNames);
    v("sde_steps", sde_steps, "SDE steps per sample: the window's width, or how many candidates are drawn",
      Between{0, 1000});
    v("window", window, "sde_window: the range [lo, hi) of steps the window lies in; empty = [0, steps)",
      Between{0, 1000});
    v("candidate_steps", candidate_steps, "epoch_global_random_choice: the steps the SDE steps are drawn from",
      Between{0, 999});
    v("timestep_fraction", timestep_fraction,
      "DiffusionNFT: the fraction of a sample's sigmas trained (max(1, int(steps x fraction)) pairs)", Between{0, 1});
    v("height", height, "latent grid height (VAE space)", Between{1, 1 << 16});
    v("width", width, "latent grid width (VAE space)", Between{1, 1 << 16});
    v("frames", frames, "latent frames (1 for images)", Between{1, 1 << 16});
    v("fps", fps, "frame rate of the video the grid encodes (LTX's RoPE time axis)", Above{0});
    v("microgroup", microgroup,
      "samples per DiT call in the rollout, which GRPO also trains as one micro-batch; 0 = train.micro_batch",
      Between{0, 1 << 20});
  }
  void validate(const Checker& c) const;
};

// One reward: the deck's single [reward] table, or one [[reward]] entry of
// several (their weighted sum is the run's reward, docs/rewards.md).
struct RewardSection {
  std::string name;
  rollout::RewardKind kind = rollout::RewardKind::Analytic;
  double weight = 1.0;
  rollout::AnalyticFunction analytic = rollout::AnalyticFunction::TargetPattern;
  std::string module;
  std::string command;
  int64_t target_seed = 1234;
  double timeout_s = 600;
  std::string url;
  rollout::RewardInput input = rollout::RewardInput::Latents;
  std::string decoder;
  int64_t batch_size = 0;
  int64_t retries = 3;
  double backoff_s = 1.0;

  template <class V>
  void fields(V& v) {
    v("name", name,
      "[[reward]] entries: the reward's name, its metric series rollout/reward/<name>/... (letters, digits, _ and -)");
    v("kind", kind,
      "what scores the final latents: a built-in analytic reward, a TorchScript module, an external command or a "
      "reward server over HTTP",
      rollout::kRewardKindNames);
    v("weight", weight, "[[reward]] entries: the reward's weight in the run's reward, the weighted sum",
      Between{-1e6, 1e6});
    v("analytic", analytic,
      "kind = \"analytic\": closeness to a seeded pattern, mean brightness, or smoothness along the width",
      rollout::kAnalyticNames);
    v("module", module, "kind = \"torchscript\": the module, forward(latents[, prompt_index]) -> [N]");
    v("command", command,
      "kind = \"command\": the program and its arguments, run without a shell; `{input}` and `{output}` are HDF5 "
      "paths");
    v("target_seed", target_seed, "seeds target_pattern's pattern", Between{0, kIntMax});
    v("timeout_s", timeout_s,
      "seconds a reward command may run before it is killed; kind = \"http\": the deadline of one request",
      Above{0, kTimeoutMax});
    v("url", url, "kind = \"http\": the reward server, e.g. \"http://127.0.0.1:8000\" (GET /health, POST /score)");
    v("input", input,
      "kind = \"http\": what the server scores: the final latents, or RGB images made by `decoder` on the run's "
      "device (the server's /health must say the same)",
      rollout::kRewardInputNames);
    v("decoder", decoder,
      "kind = \"http\", input = \"images\": a TorchScript module, forward(latents fp32) -> uint8 [B,H,W,3] or "
      "[B,F,H,W,3]");
    v("batch_size", batch_size, "kind = \"http\": samples per request; 0 = all of a scoring call's samples in one",
      Between{0, 1 << 20});
    v("retries", retries,
      "kind = \"http\": retries of a request that failed to connect, timed out or got 5xx/429, then the run fails",
      Between{0, 100});
    v("backoff_s", backoff_s, "kind = \"http\": seconds before the first retry, doubled for each next one",
      Between{0, 3600});
  }
  void validate(const Checker& c) const;
};

struct TrainSection {
  rl::Loss loss = rl::Loss::Grpo;
  double lr = 1e-4;
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool fused_adamw = false;
  double clip_grad = 1.0;
  double clip_range = 1e-4;
  double adv_clip_max = 5.0;
  double kl_beta = 0.0;
  int64_t global_batch = 8;
  int64_t micro_batch = 1;
  int64_t num_rollouts = 10;
  int64_t steps_per_rollout = 1;
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  bool std_normalization = true;
  bool global_std = false;
  bool global_mean = false;
  int64_t std_ddof = 0;
  double nft_beta = 1.0;
  bool nft_adaptive = true;
  bool nft_shuffle_timesteps = true;
  std::string on_nonfinite = "skip";
  rollout::RewardCombine reward_combine = rollout::RewardCombine::WeightedSum;

  template <class V>
  void fields(V& v) {
    v("loss", loss, "the algorithm: Flow-GRPO, DiffusionNFT or supervised fine-tuning", rl::kLossNames);
    v("lr", lr, "AdamW's learning rate (the schedule's base)", Above{0});
    v("betas", betas, "AdamW's [beta1, beta2]", Between{0, 1});
    v("eps", eps, "AdamW's epsilon", Above{0});
    v("weight_decay", weight_decay, "AdamW's decoupled weight decay", Between{0, 10});
    v("fused_adamw", fused_adamw,
      "LibTorch's fused AdamW kernel: faster, the same update up to rounding (so it changes a run's bits)");
    v("clip_grad", clip_grad, "clip the global gradient norm to this; 0 = no clipping", Between{0, 1e9});
    v("clip_range", clip_range, "GRPO: the PPO ratio's clip epsilon", Above{0});
    v("adv_clip_max", adv_clip_max, "advantages are clamped to [-adv_clip_max, adv_clip_max]", Above{0});
    v("kl_beta", kl_beta, "GRPO: weight of the KL term to the reference model (the base weights); 0 = none",
      Between{0, 1e6});
    v("global_batch", global_batch,
      "samples per optimizer step; batch x samples_per_prompt = global_batch x steps_per_rollout", Between{1, 1 << 24});
    v("micro_batch", micro_batch, "training pairs per forward", Between{1, 1 << 20});
    v("num_rollouts", num_rollouts, "rollouts the run trains", Between{1, 1e9});
    v("steps_per_rollout", steps_per_rollout, "optimizer steps per rollout", Between{1, 1 << 20});
    v("lr_schedule", lr_schedule,
      "constant; linear warmup to lr; or linear warmup then cosine decay to 0 at the run's last step",
      OneOf{"constant", "warmup", "cosine"});
    v("warmup", warmup, "optimizer steps of linear warmup", Between{0, 1e9});
    v("std_normalization", std_normalization,
      "divide advantages by the rewards' std (off when samples_per_prompt = 1)");
    v("global_std", global_std, "that std over the whole rollout instead of each prompt group");
    v("global_mean", global_mean, "subtract the rollout's mean reward instead of each prompt group's");
    v("std_ddof", std_ddof, "0 = population std (flow_grpo's numpy), 1 = unbiased (torch.std)", Between{0, 1});
    v("nft_beta", nft_beta, "DiffusionNFT: beta, the mix of the current and old velocities", Above{0});
    v("nft_adaptive", nft_adaptive, "DiffusionNFT: adaptive weighting of the branch losses");
    v("nft_shuffle_timesteps", nft_shuffle_timesteps,
      "DiffusionNFT: train a seeded random subset of each sample's sigmas; false: the first ones");
    v("on_nonfinite", on_nonfinite,
      "a non-finite loss or gradient norm: \"skip\" the step on every rank (counted), or \"stop\" the run",
      OneOf{"skip", "stop"});
    v("reward_combine", reward_combine,
      "several [[reward]] entries: advantages of their weighted sum, or the weighted sum of each reward's own "
      "advantage (every reward normalised within its prompt group first)",
      rollout::kRewardCombineNames);
  }
  void validate(const Checker& c) const;
};

struct DataSection {
  std::string prompts;
  int64_t synthetic_prompts = 64;
  int64_t seed = 0;
  std::string sft_latents;

  template <class V>
  void fields(V& v) {
    v("prompts", prompts, "the prompt-embedding dataset (HDF5, `ditrl encode-prompts`); empty = synthetic prompts");
    v("synthetic_prompts", synthetic_prompts, "how many synthetic prompts; each rollout draws a permutation of them",
      Between{1, 1 << 20});
    v("seed", seed, "seeds the prompt order, the synthetic prompts and the synthetic SFT targets", Between{0, kIntMax});
    v("sft_latents", sft_latents,
      "SFT targets: HDF5 with /latents [prompts, ...], row = prompt index; empty = seeded synthetic targets");
  }
};

struct CheckpointSection {
  int64_t every = 0;
  int64_t keep = 2;
  std::string resume;

  template <class V>
  void fields(V& v) {
    v("every", every, "rollouts between checkpoints; 0 = only at the end", Between{0, 1e9});
    v("keep", keep, "how many of the newest checkpoints are kept", Between{1, 1e6});
    v("resume", resume,
      "where to start: \"latest\", \"auto\", \"none\" or a checkpoint file; empty = a new run (`train "
      "--resume` overrides it)");
  }
};

struct MetricsSection {
  int64_t every = 1;

  template <class V>
  void fields(V& v) {
    v("every", every, "write metrics.h5 rows every this many optimizer steps", Between{1, 1e9});
  }
};

struct LogSection {
  int64_t samples_every = 0;  // app/samples.hpp
  int64_t samples = 4;
  std::string decoder;

  template <class V>
  void fields(V& v) {
    v("samples_every", samples_every,
      "write the preview samples to OUT/samples every this many rollouts, before the first and after the last: a "
      "PNG grid (image families) or an animated WebP (video families); 0 = none",
      Between{0, 1e9});
    v("samples", samples,
      "K, the preview samples: a seeded choice of prompts with fixed noise, sampled with the ODE (the same each "
      "time)",
      Between{1, 64});
    v("decoder", decoder,
      "the samples' pixels from this VAE decoder module (tools/export_decoder.py: forward(latents fp32) -> uint8 "
      "[B,H,W,3] or [B,F,H,W,3]), run on the run's device; absent: the family's latent preview");
  }
};

struct DebugSection {
  bool dump = false;
  std::vector<int64_t> rollouts{0};
  std::vector<int64_t> samples{0};
  std::vector<int64_t> steps;
  bool skip_optimizer_step = false;
  bool forbid_host_sync = false;

  template <class V>
  void fields(V& v) {
    v("dump", dump, "write rollout and training tensor dumps to OUT/debug for `ditrl align`");
    v("rollouts", rollouts, "rollout ids to dump", Between{0, 1e9});
    v("samples", samples, "global sample ids to dump; each rank dumps the ones it holds", Between{0, 1e9});
    v("steps", steps, "denoising step indices to dump; empty = the trained steps", Between{0, 1000});
    v("skip_optimizer_step", skip_optimizer_step, "compute every step's gradients but apply none");
    v("forbid_host_sync", forbid_host_sync,
      "on a GPU: a host sync in a training micro-batch's forward or backward ends the run naming the call");
  }
};

}  // namespace ditrl::config
