// `ditrl train DECK`: the main job. Per rollout, on every rank:
//
//   rollout   prompts -> sampler (the sharded DiT) -> trajectories -> rewards
//             -> advantages over the whole rollout
//   train     pairs -> optimizer windows -> micro-batches:
//             forward (same family code as the rollout) -> kernel log-prob
//             -> loss (grpo | nft | sft) -> backward (gradients reduce-
//             scattered per unit) -> clip -> AdamW on the fp32 master slices
//   record    metrics.h5 + a progress line; a checkpoint every N rollouts, at
//             the end, and at the next rollout boundary after SIGTERM/SIGUSR1.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/determinism.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/dist/log.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/metrics.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/rl/ema.hpp>
#include <ditrl/rl/grpo_loss.hpp>
#include <ditrl/rl/loss_window.hpp>
#include <ditrl/rl/lr_schedule.hpp>
#include <ditrl/rl/metrics.hpp>
#include <ditrl/rl/nft_loss.hpp>
#include <ditrl/rl/pairs.hpp>
#include <ditrl/rl/parity_dump.hpp>
#include <ditrl/rl/sft_loss.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

namespace ditrl::app {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Slurm sends SIGUSR1 (--signal=B:USR1@N) or SIGTERM before the time limit;
// the run checkpoints at the next rollout boundary and exits 0.
std::atomic<int> stop_signal{0};
extern "C" void request_stop(int signal) {
  stop_signal = signal;
}

struct TrainCli {
  std::string deck;
  std::vector<std::string> overrides;
  std::string resume;        // "", "latest", "auto" or a checkpoint path
  int64_t max_rollouts = 0;  // > 0: run at most this many rollouts, checkpoint, exit (time-boxed jobs)
  std::string trajectories;  // rollouts from files instead of the sampler; "{rollout}" -> rollout id
};

std::string trajectory_path(const std::string& pattern, int64_t rollout_id) {
  std::string path = pattern;
  const std::string key = "{rollout}";
  if (const size_t at = path.find(key); at != std::string::npos)
    path.replace(at, key.size(), std::to_string(rollout_id));
  return path;
}

models::Cond rows_of(const models::Cond& cond, const at::Tensor& rows) {
  models::Cond out;
  for (const auto& [name, tensor] : cond.tensors) out.tensors[name] = tensor.index_select(0, rows);
  return out;
}

// A second set of values for the trainable slices (the KL reference or the
// NFT EMA policy) that forwards can run on: swapped into the masters and
// the compute slices re-cast, then swapped back.
class ShadowScope {
 public:
  ShadowScope(rl::EmaShadow& shadow, shard::ShardedParams& params) : shadow_(shadow), params_(params) {
    shadow_.swap();
    params_.refresh_compute();
  }
  ~ShadowScope() {
    shadow_.swap();
    params_.refresh_compute();
  }

 private:
  rl::EmaShadow& shadow_;
  shard::ShardedParams& params_;
};

std::vector<at::Tensor> master_pieces(shard::ShardedParams& params) {
  std::vector<at::Tensor> out;
  for (const shard::ShardPiece& p : params.pieces())
    if (p.trainable) out.push_back(p.master);
  return out;
}

struct MetricRow {
  int64_t step = 0;
  std::map<std::string, double> values;
};

// Peak resident set of this process (VmHWM), for the per-rank memory metric.
double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // "VmHWM:  1234 kB"
  return std::nan("");
}

// Everything one optimizer window needs from the rollout.
struct TrainData {
  std::vector<rl::TrainPair> pairs;
  std::vector<rl::OptimizerWindow> windows;
  std::vector<at::Tensor> reference;  // per micro-batch (global index): KL mean_ref (grpo) or v_old (nft)
  int64_t pairs_per_sample = 1;
};

class Trainer {
 public:
  explicit Trainer(Run& run) : run_(run), c_(run.config) {
    lr_ = {c_.train.lr_schedule, c_.train.lr, c_.train.warmup, c_.train.num_rollouts * c_.train.steps_per_rollout};
    if (c_.train.loss == "grpo") schema_ = rl::grpo_metric_schema();
    if (c_.train.loss == "nft") schema_ = rl::nft_metric_schema();
    if (c_.train.loss == "sft") schema_ = rl::sft_metric_schema(kSftBuckets);
    lora_ = c_.model.lora.enabled;
    if (c_.train.loss == "nft" || (c_.train.kl_beta > 0 && !lora_))
      shadow_ = std::make_unique<rl::EmaShadow>(master_pieces(*run_.params), rl::EmaOptions{});
    if (c_.train.loss == "sft" && !c_.data.sft_latents.empty())
      sft_file_ = std::make_unique<io::h5::File>(io::h5::File::open(c_.data.sft_latents));
  }

  io::ExtraState extra_state() {
    io::ExtraState extra;
    if (shadow_) extra[c_.train.loss == "nft" ? "ema" : "reference"] = shadow_->shadow();
    return extra;
  }
  // The EMA decay depends on how many updates (one per rollout) happened.
  void restore_ema_steps(int64_t rollouts_done) {
    if (shadow_ && c_.train.loss == "nft") shadow_->set_step(rollouts_done);
  }

  // Trains on one rollout; appends one metric row per optimizer step.
  void train_rollout(app::RolloutBatch& batch, int64_t& global_step, std::vector<MetricRow>& rows) {
    auto start = Clock::now();
    TrainData data = prepare(batch);
    const double seconds_prepare = seconds_since(start);

    const std::map<std::string, double> rollout_stats = rollout_metrics(batch);
    for (const rl::OptimizerWindow& window : data.windows) {
      start = Clock::now();
      const shard::CommSeconds comm_start = run_.params->comm_seconds();
      seconds_forward_ = seconds_backward_ = 0;
      rl::MetricBuffer buffer(schema_);
      run_.params->zero_grad();
      size_t mb_index = static_cast<size_t>(&window - data.windows.data()) * window.micro_batches.size();
      for (const rl::MicroBatch& mb : window.micro_batches)
        micro_batch(batch, data, mb, mb_index++, window.pairs(), buffer);
      const double seconds_fb = seconds_since(start);
      const shard::CommSeconds comm_end = run_.params->comm_seconds();

      start = Clock::now();
      const double norm =
          c_.train.clip_grad > 0 ? run_.params->clip_grad(c_.train.clip_grad) : run_.params->grad_norm();
      const bool finite = std::isfinite(norm);
      const double lr = lr_.at(global_step);
      if (!finite && c_.train.on_nonfinite == "stop")
        fail(
            "rollout {}: the gradient norm is {} (non-finite loss or gradient on some rank); stopping as "
            "train.on_nonfinite = \"stop\" asks (set \"skip\" to skip such steps)",
            batch.rollout_id, norm);
      if (finite && !c_.debug.skip_optimizer_step) run_.params->adamw_step(lr);
      if (!finite) {
        ++skipped_;
        run_.params->zero_grad();
        spdlog::warn("rollout {}: non-finite gradient norm {}; optimizer step skipped ({} so far)", batch.rollout_id,
                     norm, skipped_);
      }
      buffer.emit_replicated("grad_norm", norm);
      const double seconds_opt = seconds_since(start);

      std::map<std::string, double> row = rollout_stats;
      for (const auto& [key, value] : buffer.reduce(*run_.comm)) row["train/" + key] = value;
      row["train/lr"] = lr;
      row["train/epoch"] = static_cast<double>(batch.rollout_id);
      row["train/skipped_steps"] = static_cast<double>(skipped_);
      row["perf/rollout_seconds"] = batch.seconds_sampling;
      row["perf/reward_seconds"] = batch.seconds_reward;
      row["perf/prepare_seconds"] = seconds_prepare;
      row["perf/forward_backward_seconds"] = seconds_fb;
      row["perf/forward_seconds"] = seconds_forward_;
      row["perf/backward_seconds"] = seconds_backward_;
      row["perf/gather_seconds"] = comm_end.gather - comm_start.gather;
      row["perf/reduce_scatter_seconds"] = comm_end.reduce_scatter - comm_start.reduce_scatter;
      row["perf/optimizer_seconds"] = seconds_opt;
      rows.push_back({global_step, row});
      ++global_step;
    }
    if (shadow_ && c_.train.loss == "nft") shadow_->update();  // once per rollout (algorithms.md §4.4)
  }

 private:
  static constexpr int64_t kSftBuckets = 4;

  // Pairs, windows and the no-grad reference forwards of a rollout.
  TrainData prepare(app::RolloutBatch& batch) {
    TrainData data;
    rl::RolloutView view;
    const rollout::Trajectories& t = batch.trajectories;
    view.latents = t.latents;
    view.latent_steps = t.steps.return_latents;
    view.log_probs = t.log_probs;
    view.sde_steps = t.steps.sde_steps;
    view.final_latents = c_.train.loss == "sft" ? sft_targets(t) : t.final_latents;
    view.advantages = batch.advantages;
    view.sample_index = t.sample_index;
    view.snapshot = t.snapshot;
    if (c_.train.loss == "grpo") {
      data.pairs = rl::grpo_pairs(view, run_.sampler.microgroup);
      data.pairs_per_sample = static_cast<int64_t>(t.steps.sde_steps.size());
    } else if (c_.train.loss == "nft") {
      data.pairs = rl::nft_pairs(view, c_.rollout.timestep_fraction, c_.train.nft_shuffle_timesteps, c_.run.seed);
      data.pairs_per_sample = static_cast<int64_t>(data.pairs.size()) / t.size();
    } else {
      // Wan2.2 A14B routes each grid step to one of its two experts.
      std::vector<size_t> expert_of_step;
      for (int64_t i = 0; i < t.snapshot->steps(); ++i)
        expert_of_step.push_back(run_.family->expert_for(t.snapshot->timestep(i)));
      data.pairs =
          rl::sft_pairs(view, kSftPairsPerSample, c_.run.seed, batch.rollout_id, expert_of_step, c_.train.micro_batch);
      data.pairs_per_sample = kSftPairsPerSample;
    }
    data.windows = rl::optimizer_windows(static_cast<int64_t>(data.pairs.size()), c_.train.steps_per_rollout,
                                         c_.train.loss == "grpo" ? run_.sampler.microgroup : c_.train.micro_batch);
    if (c_.train.loss == "grpo" && c_.train.kl_beta > 0) data.reference = reference_means(batch, data);
    if (c_.train.loss == "nft") data.reference = old_velocities(batch, data);
    return data;
  }

  static constexpr int64_t kSftPairsPerSample = 1;

  // SFT regresses onto per-prompt targets: [data] sft_latents rows, or seeded
  // synthetic targets keyed by the prompt.
  at::Tensor sft_targets(const rollout::Trajectories& t) {
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < t.size(); ++i) {
      const int64_t prompt = t.prompt_index[i].item<int64_t>();
      if (sft_file_) {
        rows.push_back(sft_file_->open_dataset("latents").read_rows(prompt, 1, false)[0].to(at::kFloat));
      } else {
        at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("sft_target", c_.data.seed, prompt));
        rows.push_back(at::randn(run_.latent_shape, gen, at::TensorOptions().dtype(at::kFloat)).mul_(0.5));
      }
      if (rows.back().sizes() != at::IntArrayRef(run_.latent_shape))
        fail("{}: /latents row {} has shape [{}], the model's latent is [{}]", c_.data.sft_latents, prompt,
             fmt::join(rows.back().sizes(), ", "), fmt::join(run_.latent_shape, ", "));
    }
    return at::stack(rows);
  }

  std::vector<std::pair<int64_t, int64_t>> all_micro_batches(const TrainData& data) const {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const rl::OptimizerWindow& w : data.windows)
      for (const rl::MicroBatch& mb : w.micro_batches) out.emplace_back(mb.begin, mb.end);
    return out;
  }

  std::vector<rl::TrainPair> slice(const TrainData& data, int64_t begin, int64_t end) const {
    return {data.pairs.begin() + begin, data.pairs.begin() + end};
  }

  at::Tensor velocity(const app::RolloutBatch& batch, const rl::PreparedBatch& b, const at::Tensor& latents,
                      bool guided, const models::ForwardContext& ctx) {
    const models::Cond cond = rows_of(batch.cond, b.prompt_indices);
    if (!guided) return run_.family->noise_pred(latents, b.timesteps, b.sigmas, cond, ctx);
    const models::Cond negative = run_.needs_negative ? rows_of(batch.negative, b.prompt_indices) : models::Cond{};
    return models::guided_velocity(*run_.family,
                                   {latents, b.timesteps, b.sigmas, &cond, run_.needs_negative ? &negative : nullptr},
                                   run_.sampler.guidance, ctx);
  }
  at::Tensor velocity(const app::RolloutBatch& batch, const rl::PreparedBatch& b, const at::Tensor& latents,
                      bool guided) {
    return velocity(batch, b, latents, guided, run_.forward_context());
  }

  // The parity-dump tap of a GRPO micro-batch (the rollout forward's batch).
  std::unique_ptr<models::Tap> dump_tap(const app::RolloutBatch& batch, const rl::PreparedBatch& b) {
    if (!run_.dump) return nullptr;
    const at::Tensor samples = b.sample_indices.to(at::kLong).contiguous();
    const at::Tensor steps = b.step_indices.to(at::kLong).contiguous();
    auto values = [](const at::Tensor& t) {
      return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    };
    return run_.dump->tap(rl::DumpSide::Train, batch.rollout_id, values(samples), values(steps), /*trained=*/true);
  }

  // GRPO KL reference: the transition mean under the reference weights (the
  // LoRA base, or the initial weights), computed once per rollout before any
  // update, which is what a reference forward inside the step would give.
  std::vector<at::Tensor> reference_means(app::RolloutBatch& batch, const TrainData& data) {
    torch::NoGradGuard no_grad;
    std::unique_ptr<models::LoraDisableGuard> base;
    std::unique_ptr<ShadowScope> scope;
    if (lora_)
      base = std::make_unique<models::LoraDisableGuard>();
    else
      scope = std::make_unique<ShadowScope>(*shadow_, *run_.params);
    std::vector<at::Tensor> out;
    run_.params->begin_step();
    for (const auto& [begin, end] : all_micro_batches(data)) {
      const rl::PreparedBatch b = rl::prepare_batch(slice(data, begin, end));
      const at::Tensor v = velocity(batch, b, b.latents, /*guided=*/true);
      out.push_back(diffusion::sde_step(run_.sampler.kernel, v, b.latents, b.step_sigmas(),
                                        diffusion::StepTarget::score(b.next_latents))
                        .mean);
    }
    return out;
  }

  // NFT old policy: the EMA weights' velocity on each pair's corrupted latent.
  std::vector<at::Tensor> old_velocities(app::RolloutBatch& batch, const TrainData& data) {
    torch::NoGradGuard no_grad;
    ShadowScope scope(*shadow_, *run_.params);
    std::vector<at::Tensor> out;
    run_.params->begin_step();
    for (const auto& [begin, end] : all_micro_batches(data)) {
      const rl::PreparedBatch b = rl::prepare_batch(slice(data, begin, end));
      const at::Tensor x_t = rl::corrupt(
          b.latents, b.sigmas, rl::pair_noise("nft_corrupt", c_.run.seed, batch.rollout_id, b, run_.latent_shape));
      out.push_back(velocity(batch, b, x_t, /*guided=*/false));
    }
    return out;
  }

  void micro_batch(app::RolloutBatch& batch, const TrainData& data, const rl::MicroBatch& mb, size_t index,
                   int64_t window_pairs, rl::MetricBuffer& buffer) {
    const auto start = Clock::now();
    run_.params->begin_step();
    const rl::PreparedBatch b = rl::prepare_batch(slice(data, mb.begin, mb.end));
    at::Tensor loss_sum;
    if (c_.train.loss == "grpo") {
      const std::unique_ptr<models::Tap> tap = dump_tap(batch, b);
      models::ForwardContext ctx = run_.forward_context();
      if (tap) ctx.tap = tap.get();
      const at::Tensor v = velocity(batch, b, b.latents, /*guided=*/true, ctx);
      const diffusion::StepResult r = diffusion::sde_step(run_.sampler.kernel, v, b.latents, b.step_sigmas(),
                                                          diffusion::StepTarget::score(b.next_latents));
      rl::record_sde_step(ctx, r);
      rl::GrpoOptions o{c_.train.clip_range, c_.train.adv_clip_max, c_.train.kl_beta};
      std::unique_ptr<rl::KlInputs> kl;
      if (o.kl_beta > 0)
        kl = std::make_unique<rl::KlInputs>(rl::KlInputs{r.mean, data.reference.at(index), r.std_dev_t});
      const rl::GrpoTerms terms = rl::grpo_loss(r.log_prob, b.log_prob_old, b.advantages, o, kl.get());
      rl::record_grpo_metrics(buffer, terms, r.log_prob, b.log_prob_old, o.clip_range);
      if (batch.trajectories.model_outputs.defined())
        rl::record_model_output_diff(buffer, v.detach().to(at::kFloat), rollout_outputs(batch, b));
      loss_sum = terms.loss_sum;
    } else if (c_.train.loss == "nft") {
      const at::Tensor x_t = rl::corrupt(
          b.latents, b.sigmas, rl::pair_noise("nft_corrupt", c_.run.seed, batch.rollout_id, b, run_.latent_shape));
      const at::Tensor v = velocity(batch, b, x_t, /*guided=*/false);
      const rl::NftTerms terms = rl::nft_loss(v, data.reference.at(index), b.latents, x_t, b.sigmas, b.advantages,
                                              {c_.train.nft_beta, c_.train.adv_clip_max, c_.train.nft_adaptive});
      rl::record_nft_metrics(buffer, terms, b.advantages, b.sigmas, data.pairs_per_sample);
      loss_sum = terms.loss_sum;
    } else {
      const at::Tensor noise = rl::pair_noise("sft_noise", c_.run.seed, batch.rollout_id, b, run_.latent_shape);
      const at::Tensor v = velocity(batch, b, rl::corrupt(b.latents, b.sigmas, noise), /*guided=*/false);
      const rl::SftTerms terms = rl::sft_loss(v, b.latents, noise);
      rl::record_sft_metrics(buffer, terms, b.sigmas, kSftBuckets);
      loss_sum = terms.loss_sum;
    }
    const at::Tensor objective = rl::window_objective(loss_sum, window_pairs);
    seconds_forward_ += seconds_since(start);
    const auto backward_start = Clock::now();
    objective.backward();
    run_.params->finish_backward();
    seconds_backward_ += seconds_since(backward_start);
  }

  // The rollout's velocity for each pair (its sample at its step).
  at::Tensor rollout_outputs(const app::RolloutBatch& batch, const rl::PreparedBatch& b) const {
    const rollout::Trajectories& t = batch.trajectories;
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < b.size(); ++i)
      rows.push_back(
          t.model_outputs[b.prompt_indices[i].item<int64_t>()][t.sde_slot(b.step_indices[i].item<int64_t>())]);
    return at::stack(rows);
  }

  std::map<std::string, double> rollout_metrics(const app::RolloutBatch& batch) const {
    std::map<std::string, double> row;
    for (const auto& [key, value] : rl::reward_stats(batch.all_rewards, c_.rollout.samples_per_prompt))
      row["rollout/reward/" + key] = value;
    at::Tensor all_advantages = at::empty({run_.samples_per_rollout}, at::kFloat);
    run_.comm->all_gather(batch.advantages, all_advantages);
    for (const auto& [key, value] : rl::advantage_stats(all_advantages)) row["rollout/reward/" + key] = value;
    row["rollout/step"] = static_cast<double>(batch.rollout_id);
    return row;
  }

  Run& run_;
  const config::Config& c_;
  rl::LrSchedule lr_;
  rl::MetricSchema schema_;
  bool lora_ = false;
  std::unique_ptr<rl::EmaShadow> shadow_;
  std::unique_ptr<io::h5::File> sft_file_;
  int64_t skipped_ = 0;
  double seconds_forward_ = 0, seconds_backward_ = 0;  // of the current optimizer window
};

void write_status(const std::string& out_dir, const std::string& status) {
  const std::filesystem::path path = std::filesystem::path(out_dir) / "status";
  std::ofstream(path.string() + ".tmp") << status << "\n";
  std::filesystem::rename(path.string() + ".tmp", path);
}

std::string progress_line(int64_t rollout_id, int64_t total, const std::map<std::string, double>& row, double seconds,
                          double eta) {
  auto get = [&row](const char* key) {
    auto it = row.find(key);
    return it == row.end() ? std::nan("") : it->second;
  };
  return fmt::format(
      "rollout {}/{}  reward {:.4f} +- {:.4f}  loss {:.4g}  lp_diff {:.3g}  grad_norm {:.4g}  {:.2f} s/rollout  "
      "ETA {:.0f} s",
      rollout_id + 1, total, get("rollout/reward/raw_mean"), get("rollout/reward/raw_std"), get("train/loss"),
      get("train/log_prob_mean_abs_diff"), get("train/grad_norm"), seconds, eta);
}

int train(const TrainCli& cli) {
  const config::Config config = config::load_deck(cli.deck, cli.overrides);
  const int deterministic_threads = config.run.threads > 0 ? static_cast<int>(config.run.threads) : 1;
  if (config.run.deterministic) pin_cpu_kernels(deterministic_threads);
  dist::MpiRuntime mpi(nullptr, nullptr);
  if (mpi.world().rank == 0) std::filesystem::create_directories(config.run.out_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  dist::setup_logging(mpi.world(), config.run.out_dir, config.run.log_level);
  at::set_num_threads(config.run.deterministic ? deterministic_threads
                      : config.run.threads > 0 ? static_cast<int>(config.run.threads)
                                               : mpi.default_threads());
  spdlog::info("ditrl train {} on {} rank(s), {} intra-op thread(s){}", cli.deck, mpi.world().size,
               at::get_num_threads(), config.run.deterministic ? ", deterministic: " + cpu_kernel_pins() : "");
  // The training path runs on the CPU in every build so far (ShardOptions' device).
  dist::log_placement(mpi.world(), at::get_num_threads(), "cpu", MPI_COMM_WORLD);

  Run run = open_run(config, mpi);
  Trainer trainer(run);

  std::string resume = cli.resume.empty() ? config.checkpoint.resume : cli.resume;
  if (resume == "auto")
    resume =
        std::filesystem::exists(std::filesystem::path(config.run.out_dir) / "checkpoints" / "latest") ? "latest" : "";
  int64_t first_rollout = 0, global_step = 0;
  if (!resume.empty()) {
    const std::string path = io::resolve_checkpoint(config.run.out_dir, resume);
    io::ExtraState extra = trainer.extra_state();
    const io::CheckpointMeta meta = io::load_checkpoint(path, *run.params, extra, MPI_COMM_WORLD);
    first_rollout = meta.rollout_id;
    global_step = meta.step;
    trainer.restore_ema_steps(first_rollout);
    spdlog::info("resumed from {} (written by {} rank(s)): rollout {}, optimizer step {}", path, meta.world_size,
                 first_rollout, global_step);
  }

  std::unique_ptr<io::MetricsWriter> metrics;
  if (mpi.world().rank == 0)
    metrics = std::make_unique<io::MetricsWriter>((std::filesystem::path(config.run.out_dir) / "metrics.h5").string(),
                                                  run.deck_text, !resume.empty(), global_step);
  std::signal(SIGTERM, request_stop);
  std::signal(SIGUSR1, request_stop);

  auto save = [&](int64_t next_rollout) {
    const auto start = Clock::now();
    const std::string path = io::save_checkpoint(config.run.out_dir, *run.params,
                                                 {global_step, next_rollout, mpi.world().size, run.params->step_count(),
                                                  next_rollout * config.rollout.batch, run.deck_text},
                                                 trainer.extra_state(), config.checkpoint.keep, MPI_COMM_WORLD);
    const double seconds = seconds_since(start);
    spdlog::info("checkpoint {} ({:.2f} s)", path, seconds);
    return seconds;
  };
  const shard::MemoryReport memory = run.params->memory_report();
  const double state_bytes = static_cast<double>(memory.masters + memory.moments + memory.grads + memory.compute);

  const int64_t total = config.train.num_rollouts;
  const auto run_start = Clock::now();
  for (int64_t rollout_id = first_rollout; rollout_id < total; ++rollout_id) {
    const auto start = Clock::now();
    const double rollout_gather_start = run.params->comm_seconds().gather;
    RolloutBatch batch = cli.trajectories.empty()
                             ? collect_rollout(run, rollout_id)
                             : load_rollout(run, trajectory_path(cli.trajectories, rollout_id), rollout_id);
    const double rollout_gather = run.params->comm_seconds().gather - rollout_gather_start;
    std::vector<MetricRow> rows;
    trainer.train_rollout(batch, global_step, rows);
    const std::map<std::string, double>& row = rows.back().values;
    const double seconds = seconds_since(start);
    const double eta = seconds_since(run_start) / static_cast<double>(rollout_id + 1 - first_rollout) *
                       static_cast<double>(total - rollout_id - 1);
    if (mpi.world().rank == 0) spdlog::info(progress_line(rollout_id, total, row, seconds, eta));

    // Every rank must agree to stop, whichever received the signal; the
    // same reduction carries the largest peak RSS over ranks.
    at::Tensor stop = at::tensor({static_cast<double>(stop_signal.load()), peak_rss_bytes()}, at::kDouble);
    run.comm->all_reduce(stop, dist::ReduceOp::Max);
    const bool last = rollout_id + 1 == total;
    const bool due = config.checkpoint.every > 0 && (rollout_id + 1) % config.checkpoint.every == 0;
    const bool signalled = stop[0].item<double>() > 0;
    const bool boxed = cli.max_rollouts > 0 && rollout_id + 1 - first_rollout >= cli.max_rollouts;
    const double seconds_checkpoint = last || due || signalled || boxed ? save(rollout_id + 1) : 0.0;
    // Rows go out after the checkpoint, so the last one of a rollout carries
    // its checkpoint time (the iteration's whole cost).
    rows.back().values["perf/checkpoint_seconds"] = seconds_checkpoint;
    for (MetricRow& r : rows) {
      r.values["perf/rollout_gather_seconds"] = rollout_gather;
      r.values["perf/state_bytes"] = state_bytes;
      r.values["perf/peak_rss_bytes"] = stop[1].item<double>();
      if (metrics && r.step % config.metrics.every == 0) metrics->write(r.step, r.values);
    }
    if ((signalled || boxed) && !last) {
      if (signalled)
        spdlog::info("signal {} received: checkpointed after rollout {}; exiting for requeue",
                     static_cast<int>(stop[0].item<double>()), rollout_id);
      else
        spdlog::info("--max-rollouts {} reached: checkpointed after rollout {}", cli.max_rollouts, rollout_id);
      if (mpi.world().rank == 0) write_status(config.run.out_dir, "preempted");
      return 0;
    }
  }
  if (mpi.world().rank == 0) write_status(config.run.out_dir, "complete");
  spdlog::info("training complete: {} rollouts, {} optimizer steps, {:.1f} s", total - first_rollout, global_step,
               seconds_since(run_start));
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<TrainCli>();
  CLI::App* sub =
      app.add_subcommand("train", "Run RL post-training from a deck (under srun/mpirun: one rank per GPU or core)");
  sub->add_option("deck", cli->deck, "TOML deck")->required();
  sub->add_option("--set", cli->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--resume", cli->resume,
                  "Resume from `latest`, a checkpoint path, or `auto` (latest when one exists, else start)");
  sub->add_option("--trajectories", cli->trajectories,
                  "Train on rollouts from trajectory files (an external engine, or `ditrl rollout`) instead of "
                  "sampling; `{rollout}` in the path is replaced by the rollout id");
  sub->add_option("--max-rollouts", cli->max_rollouts,
                  "Run at most N rollouts in this invocation, then checkpoint and exit (resume with --resume latest)")
      ->check(CLI::NonNegativeNumber);
  sub->callback([cli, &selected] { selected = [cli] { return train(*cli); }; });
}

}  // namespace ditrl::app
