#pragma once

// The deck's sections (docs/design.md §5). Each section lists its keys once in
// fields() and checks its cross-key rules in validate(); the subsystem that
// consumes a section owns its rules. Defaults are the values a user gets when
// a key is absent and are printed by `ditrl check`.

#include <ditrl/config/schema.hpp>

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
  // With deterministic: sum each optimizer step's micro-batch gradients in
  // the canonical tree (shard/grad_reduce.hpp), so results do not depend on
  // the rank count; false keeps the sequential sum and saves the tree's
  // partial gradient slices (reproducible at one rank count only).
  bool rank_invariant = true;
  int64_t threads = 0;  // intra-op threads per rank; 0 = cores / ranks on the node
  std::string log_level = "info";
  // "auto": the rank's GPU when this is a CUDA build and one is visible.
  std::string device = "auto";
  // Refuse to start when `ditrl plan`'s predicted peak per rank exceeds the
  // memory the rank can have (app/memory_check.hpp).
  bool check_memory = true;

  template <class V>
  void fields(V& v) {
    v("name", name);
    v("out_dir", out_dir);
    v("seed", seed, Between{0, kIntMax});
    v("deterministic", deterministic);
    v("rank_invariant", rank_invariant);
    v("threads", threads, Between{0, 4096});
    v("log_level", log_level, OneOf{"trace", "debug", "info", "warn", "error"});
    v("device", device, OneOf{"auto", "cpu", "cuda"});
    v("check_memory", check_memory);
  }
  void validate(const Checker& c) const;
};

struct LoraSection {
  bool enabled = false;
  int64_t rank = 32;
  double alpha = 64.0;
  std::vector<std::string> targets;  // empty = the family's default targets
  std::string init = "gaussian";
  // Start from an existing adapter instead of the init: a PEFT folder, a
  // diffusers LoRA file or an LTX-2 LoRA file (rank, alpha and the adapted
  // modules must be the deck's).
  std::string weights;

  template <class V>
  void fields(V& v) {
    v("enabled", enabled);
    v("rank", rank, Between{1, 65536});
    v("alpha", alpha, Above{0});
    v("targets", targets);
    v("init", init, OneOf{"gaussian", "kaiming"});
    v("weights", weights);
  }
};

struct ModelSection {
  std::string family;
  std::string preset = "tiny";
  std::string config;     // optional config.json overriding the preset's architecture
  std::string weights;    // safetensors file or *.index.json; empty = seeded init
  std::string weights_2;  // second expert (Wan2.2 A14B low-noise transformer_2)
  int64_t init_seed = 0;
  LoraSection lora;

  template <class V>
  void fields(V& v) {
    v.required("family", family, OneOf{"sd3", "wan", "ltx", "qwen_image"});
    v("preset", preset);
    v("config", config);
    v("weights", weights);
    v("weights_2", weights_2);
    v("init_seed", init_seed, Between{0, kIntMax});
    v.table("lora", lora);
  }
  void validate(const Checker& c) const;
};

struct OverrideRule {
  std::string pattern;
  std::string dtype;

  template <class V>
  void fields(V& v) {
    v.required("pattern", pattern);
    v.required("dtype", dtype, OneOf{"fp32", "bf16", "fp16"});
  }
};

struct InputPolicySection {
  std::string latents = "default";
  std::string cond = "default";
  std::string timestep = "passthrough";

  template <class V>
  void fields(V& v) {
    const OneOf policy{"default", "fp32", "bf16", "fp16", "passthrough"};
    v("latents", latents, policy);
    v("cond", cond, policy);
    v("timestep", timestep, policy);
  }
};

struct PrecisionSection {
  std::string master = "fp32";
  std::string reduce = "fp32";
  std::string forward = "bf16";
  std::string attention = "math";
  // How bf16/fp16 GEMMs run on a CPU (precision/cpu_half_gemm.hpp): "auto"
  // widens them to fp32 GEMMs unless the CPU has AVX512-BF16 or AMX-BF16.
  std::string cpu_half_gemm = "auto";
  // Which kernel runs fp32 GEMMs on a CPU (precision/cpu_fp32_gemm.hpp):
  // "auto" takes oneDNN's unless the run is deterministic or the CPU is Intel's.
  std::string cpu_fp32_gemm = "auto";
  std::vector<OverrideRule> overrides;
  bool family_overrides = true;  // apply the family's default fp32-kept parameters first
  InputPolicySection inputs;

  template <class V>
  void fields(V& v) {
    const OneOf dtype{"fp32", "bf16", "fp16"};
    v("master", master, dtype);
    v("reduce", reduce, dtype);
    v("forward", forward, dtype);
    v("attention", attention, OneOf{"math", "flash", "efficient", "cudnn"});
    v("cpu_half_gemm", cpu_half_gemm, OneOf{"auto", "native", "widened"});
    v("cpu_fp32_gemm", cpu_fp32_gemm, OneOf{"auto", "blas", "onednn"});
    v.tables("override", overrides);
    v("family_overrides", family_overrides);
    v.table("inputs", inputs);
  }
  void validate(const Checker& c) const;
};

struct ParallelSection {
  bool reshard_after_forward = true;
  bool prefetch = true;
  bool rollout_keep_gathered = false;  // keep gathered units resident across rollout steps
  // Rebuild each block's graph in backward (activation checkpointing); false
  // keeps every block's activations from the forward: no second forward, at
  // the memory of all blocks' activations.
  bool recompute = true;
  double startup_timeout_s = 300;
  double collective_timeout_s = 100;
  // Ranks that share one sample, its tokens split across them (Ulysses); it
  // divides the world size and the model's attention heads.
  int64_t sequence_parallel = 1;

  template <class V>
  void fields(V& v) {
    v("reshard_after_forward", reshard_after_forward);
    v("prefetch", prefetch);
    v("rollout_keep_gathered", rollout_keep_gathered);
    v("recompute", recompute);
    v("startup_timeout_s", startup_timeout_s, Above{0, kTimeoutMax});
    v("collective_timeout_s", collective_timeout_s, Above{0, kTimeoutMax});
    v("sequence_parallel", sequence_parallel, Between{1, 65536});
  }
};

struct RolloutSection {
  int64_t steps = 10;
  std::optional<double> shift;  // static shift; absent = the family preset's schedule
  std::string sde = "sde";
  double noise_level = 0.7;
  double guidance_scale = 1.0;
  std::optional<double> guidance_scale_2;  // Wan2.2 low-noise expert
  std::optional<double> true_cfg_scale;    // Qwen-Image true CFG
  bool negative_prompt = false;
  int64_t samples_per_prompt = 4;
  int64_t batch = 2;  // prompts per rollout
  std::string strategy = "sde_window";
  int64_t sde_steps = 1;                 // window size / number of SDE steps drawn
  std::vector<int64_t> window;           // [lo, hi); empty = [0, steps)
  std::vector<int64_t> candidate_steps;  // epoch_global_random_choice
  double timestep_fraction = 0.99;
  int64_t height = 16;  // latent grid (VAE space)
  int64_t width = 16;
  int64_t frames = 1;
  double fps = 24.0;       // frame rate of the video the grid encodes (LTX RoPE time axis)
  int64_t microgroup = 0;  // samples per DiT call; 0 = whole rollout batch on the rank

  template <class V>
  void fields(V& v) {
    v("steps", steps, Between{1, 1000});
    v("shift", shift, Above{0});
    v("sde", sde, OneOf{"sde", "cps", "ode"});
    v("noise_level", noise_level, Between{0, 10});
    v("guidance_scale", guidance_scale, Between{0, 100});
    v("guidance_scale_2", guidance_scale_2, Between{0, 100});
    v("true_cfg_scale", true_cfg_scale, Between{0, 100});
    v("negative_prompt", negative_prompt);
    v("samples_per_prompt", samples_per_prompt, Between{1, 4096});
    v("batch", batch, Between{1, 1 << 20});
    v("strategy", strategy, OneOf{"sde_window", "epoch_global_random_choice", "ode_and_return_last"});
    v("sde_steps", sde_steps, Between{0, 1000});
    v("window", window, Between{0, 1000});
    v("candidate_steps", candidate_steps, Between{0, 999});
    v("timestep_fraction", timestep_fraction, Between{0, 1});
    v("height", height, Between{1, 1 << 16});
    v("width", width, Between{1, 1 << 16});
    v("frames", frames, Between{1, 1 << 16});
    v("fps", fps, Above{0});
    v("microgroup", microgroup, Between{0, 1 << 20});
  }
  void validate(const Checker& c) const;
};

struct RewardSection {
  std::string kind = "analytic";
  std::string analytic = "target_pattern";
  std::string module;   // TorchScript reward model (kind = "torchscript")
  std::string command;  // external reward command (kind = "command")
  int64_t target_seed = 1234;
  double timeout_s = 600;

  template <class V>
  void fields(V& v) {
    v("kind", kind, OneOf{"analytic", "torchscript", "command"});
    v("analytic", analytic, OneOf{"target_pattern", "brightness", "smoothness"});
    v("module", module);
    v("command", command);
    v("target_seed", target_seed, Between{0, kIntMax});
    v("timeout_s", timeout_s, Above{0, kTimeoutMax});
  }
  void validate(const Checker& c) const;
};

struct TrainSection {
  std::string loss = "grpo";
  double lr = 1e-4;
  std::vector<double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  // LibTorch's fused AdamW kernel (one pass over the moments and masters):
  // faster, the same update up to rounding, so it changes a run's bits.
  bool fused_adamw = false;
  double clip_grad = 1.0;  // 0 = no clipping
  double clip_range = 1e-4;
  double adv_clip_max = 5.0;
  double kl_beta = 0.0;
  int64_t global_batch = 8;  // samples per optimizer step
  int64_t micro_batch = 1;   // pairs per forward
  int64_t num_rollouts = 10;
  int64_t steps_per_rollout = 1;  // optimizer steps per rollout
  std::string lr_schedule = "constant";
  int64_t warmup = 0;
  bool std_normalization = true;
  bool global_std = false;
  bool global_mean = false;
  int64_t std_ddof = 0;  // 0 = population std (flow_grpo), 1 = unbiased (torch.std)
  double nft_beta = 1.0;
  bool nft_adaptive = true;
  bool nft_shuffle_timesteps = true;
  std::string on_nonfinite = "skip";

  template <class V>
  void fields(V& v) {
    v("loss", loss, OneOf{"grpo", "nft", "sft"});
    v("lr", lr, Above{0});
    v("betas", betas, Between{0, 1});
    v("eps", eps, Above{0});
    v("weight_decay", weight_decay, Between{0, 10});
    v("fused_adamw", fused_adamw);
    v("clip_grad", clip_grad, Between{0, 1e9});
    v("clip_range", clip_range, Above{0});
    v("adv_clip_max", adv_clip_max, Above{0});
    v("kl_beta", kl_beta, Between{0, 1e6});
    v("global_batch", global_batch, Between{1, 1 << 24});
    v("micro_batch", micro_batch, Between{1, 1 << 20});
    v("num_rollouts", num_rollouts, Between{1, 1e9});
    v("steps_per_rollout", steps_per_rollout, Between{1, 1 << 20});
    v("lr_schedule", lr_schedule, OneOf{"constant", "warmup", "cosine"});
    v("warmup", warmup, Between{0, 1e9});
    v("std_normalization", std_normalization);
    v("global_std", global_std);
    v("global_mean", global_mean);
    v("std_ddof", std_ddof, Between{0, 1});
    v("nft_beta", nft_beta, Above{0});
    v("nft_adaptive", nft_adaptive);
    v("nft_shuffle_timesteps", nft_shuffle_timesteps);
    v("on_nonfinite", on_nonfinite, OneOf{"skip", "stop"});
  }
  void validate(const Checker& c) const;
};

struct DataSection {
  std::string prompts;  // HDF5 prompt-embedding dataset; empty = synthetic
  int64_t synthetic_prompts = 64;
  int64_t seed = 0;
  // SFT targets: HDF5 with /latents [prompts, ...] (row = prompt index);
  // empty = seeded synthetic targets per prompt.
  std::string sft_latents;

  template <class V>
  void fields(V& v) {
    v("prompts", prompts);
    v("synthetic_prompts", synthetic_prompts, Between{1, 1 << 20});  // each rollout draws a permutation of them
    v("seed", seed, Between{0, kIntMax});
    v("sft_latents", sft_latents);
  }
};

struct CheckpointSection {
  int64_t every = 0;  // rollouts between checkpoints; 0 = only at the end
  int64_t keep = 2;
  std::string resume;  // "", "latest" or a checkpoint path

  template <class V>
  void fields(V& v) {
    v("every", every, Between{0, 1e9});
    v("keep", keep, Between{1, 1e6});
    v("resume", resume);
  }
};

struct MetricsSection {
  int64_t every = 1;

  template <class V>
  void fields(V& v) {
    v("every", every, Between{1, 1e9});
  }
};

struct DebugSection {
  bool dump = false;
  std::vector<int64_t> rollouts{0};  // rollout ids to dump
  std::vector<int64_t> samples{0};
  std::vector<int64_t> steps;  // empty = every trained step
  bool skip_optimizer_step = false;
  bool forbid_host_sync = false;  // on a GPU: a host sync in a micro-batch's forward/backward is an error

  template <class V>
  void fields(V& v) {
    v("dump", dump);
    v("rollouts", rollouts, Between{0, 1e9});
    v("samples", samples, Between{0, 1e9});
    v("steps", steps, Between{0, 1000});
    v("skip_optimizer_step", skip_optimizer_step);
    v("forbid_host_sync", forbid_host_sync);
  }
};

}  // namespace ditrl::config
