// `ditrl train DECK`: the main job. Per rollout, on every rank:
//
//   rollout   prompts -> sampler (the sharded DiT) -> trajectories -> rewards
//             -> advantages over the whole rollout        (rollout/collect.hpp)
//   train     pairs -> optimizer windows -> micro-batches:
//             forward (same family code as the rollout) -> loss of the
//             algorithm (rl/algorithm.hpp) -> backward (gradients reduce-
//             scattered per unit) -> clip -> AdamW on the fp32 master slices
//   record    metrics.h5 + a progress line; a checkpoint every N rollouts and
//             at the end.
//
// SIGTERM/SIGUSR1 (app/stop_signal.hpp) stop the run at its next safe point,
// agreed by every rank: before each denoising step, after the rewards and
// before each micro-batch of the rollout's first optimizer window drop the
// rollout in progress (nothing of it has reached the weights yet) and
// checkpoint the state before it; from the first optimizer step on, the
// rollout is finished and checkpointed at its end.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/determinism.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/app/out_dir.hpp>
#include <ditrl/app/progress.hpp>
#include <ditrl/app/report.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/app/run_checkpoints.hpp>
#include <ditrl/app/samples.hpp>
#include <ditrl/app/stop_signal.hpp>
#include <ditrl/build_info.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>
#include <ditrl/fault_injection.hpp>
#include <ditrl/io/metrics.hpp>
#include <ditrl/rl/loss_window.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <string>
#include <utility>

namespace ditrl::app {

namespace {

// The largest stop signal any rank has received, 0 for none; collective
// over `host`, so every rank gets the same answer at the same call.
int agreed_stop_signal(dist::Communicator& host) {
  at::Tensor stop = at::full({1}, static_cast<double>(stop_signal()), at::kDouble);
  host.all_reduce(stop, dist::ReduceOp::Max);
  return static_cast<int>(stop.item<double>());
}

// Raised on every rank at the same safe point once a stop is agreed.
class RolloutAbandoned : public std::exception {
 public:
  RolloutAbandoned(int signal, std::string where) : signal_(signal), where_(std::move(where)) {}
  const char* what() const noexcept override { return where_.c_str(); }
  int signal() const { return signal_; }

 private:
  int signal_;
  std::string where_;
};

std::string trajectory_path(const std::string& pattern, int64_t rollout_id) {
  std::string path = pattern;
  const std::string key = "{rollout}";
  if (const size_t at = path.find(key); at != std::string::npos)
    path.replace(at, key.size(), std::to_string(rollout_id));
  return path;
}

struct TrainCli {
  std::string deck;
  std::vector<std::string> overrides;
  std::string resume;               // "", "latest", "auto" or a checkpoint path
  int64_t max_rollouts = 0;         // > 0: run at most this many rollouts, checkpoint, exit (time-boxed jobs)
  std::string trajectories;         // rollouts from files instead of the sampler; "{rollout}" -> rollout id
  bool allow_changed_deck = false;  // resume although trajectory keys differ from the checkpoint's deck
};

class Trainer {
 public:
  Trainer(Run& run, const TrainCli& cli) : run_(run), c_(run.config), cli_(cli), lr_(lr_schedule(run.config)) {
    run_.collector->set_before_step([this](int64_t step) { safe_point("before denoising step {}", step + 1); });
  }

  // One rollout: rollout -> rewards -> advantages -> windows -> micro-batches
  // -> clip -> AdamW -> record; one metric row per optimizer step.
  std::vector<MetricRow> train_rollout(int64_t rollout_id) {
    const double gather_start = run_.params->comm_seconds().gather;
    const rollout::RolloutBatch batch = collect(rollout_id);
    const double rollout_gather = run_.params->comm_seconds().gather - gather_start;
    safe_point("after the rewards");
    const auto start = Clock::now();
    const rl::TrainingRollout rollout = training_rollout(batch);
    const rl::TrainData data = run_.algorithm->prepare(rollout);
    const double seconds_prepare = seconds_since(start);
    const std::map<std::string, double> rollout_row = run_.collector->metrics(batch);

    std::vector<MetricRow> rows;
    size_t mb_index = 0;
    for (const rl::OptimizerWindow& window : data.windows) {
      const shard::CommSeconds comm_start = run_.params->comm_seconds();
      StepTimes times(run_.runtime->device());
      rl::MetricBuffer metrics(run_.algorithm->metric_schema(), run_.runtime->device(), window.leaves);
      times.forward_backward.start();
      run_.params->zero_grad();
      for (const rl::MicroBatch& mb : window.micro_batches) {
        if (rows.empty()) safe_point("before training micro-batch {}", mb_index + 1);
        metrics.set_leaf(mb.leaf);
        micro_batch(rollout, data, mb, mb_index++, window.pairs(), metrics, times);
      }
      times.forward_backward.stop();
      const shard::CommSeconds comm_end = run_.params->comm_seconds();

      times.optimizer.start();
      const double lr = lr_.at(global_step_);
      const double norm = optimizer_step(rollout_id, lr);
      metrics.emit_replicated("grad_norm", norm);
      times.optimizer.stop();

      std::map<std::string, double> row = rollout_row;
      for (const auto& [key, value] : metrics.reduce(run_.runtime->sequence().samples())) row["train/" + key] = value;
      row["train/lr"] = lr;
      row["train/epoch"] = static_cast<double>(rollout_id);
      row["train/skipped_steps"] = static_cast<double>(skipped_);
      row["perf/rollout_seconds"] = batch.seconds_sampling;
      row["perf/reward_seconds"] = batch.seconds_reward;
      row["perf/prepare_seconds"] = seconds_prepare;
      row["perf/rollout_gather_seconds"] = rollout_gather;
      times.record(row, comm_end.gather - comm_start.gather, comm_end.reduce_scatter - comm_start.reduce_scatter);
      rows.push_back({global_step_++, row});
    }
    run_.algorithm->end_rollout();
    return rows;
  }

  int64_t global_step() const { return global_step_; }
  void resume_at(int64_t global_step) { global_step_ = global_step; }

 private:
  // Until the rollout's first optimizer step its work can be dropped: a
  // rank's partial gradients are discarded, the weights are untouched.
  template <class... Args>
  void safe_point(fmt::format_string<Args...> where, Args&&... args) {
    if (const int signal = agreed_stop_signal(run_.runtime->host())) {
      run_.params->zero_grad();
      throw RolloutAbandoned(signal, fmt::format(where, std::forward<Args>(args)...));
    }
  }

  rollout::RolloutBatch collect(int64_t rollout_id) {
    if (cli_.trajectories.empty()) return run_.collector->collect(rollout_id);
    const std::string path = trajectory_path(cli_.trajectories, rollout_id);
    rollout::RolloutBatch batch = run_.collector->load(path, rollout_id);
    if (run_.traits.microgroup_batches && run_.policy.microgroup > 1 && !batch.trajectories.model_outputs.defined())
      spdlog::warn("trajectories {}: no /model_outputs; train/model_output_* metrics are not reported", path);
    return batch;
  }

  void micro_batch(const rl::TrainingRollout& rollout, const rl::TrainData& data, const rl::MicroBatch& mb,
                   size_t index, int64_t window_pairs, rl::MetricBuffer& metrics, StepTimes& times) {
    const dist::ForbidHostSync strict(c_.debug.forbid_host_sync, run_.runtime->device());
    times.forward.start();
    run_.params->begin_step();
    const rl::PreparedBatch b = rl::prepare_batch(data.slice(mb), run_.runtime->device());
    at::Tensor loss_sum = run_.algorithm->micro_batch_loss(rollout, data, b, index, metrics);
    // A sample gone bad (a test's NaN loss on one rank): train.on_nonfinite's agreed skip or stop runs.
    if (fault_requested("DITRL_TEST_NONFINITE_LOSS", run_.runtime->world().rank, global_step_))
      loss_sum = loss_sum * std::nan("");
    const at::Tensor objective = rl::window_objective(loss_sum, window_pairs);
    times.forward.stop();
    times.backward.start();
    objective.backward();
    run_.params->finish_backward();
    times.backward.stop();
  }

  // Clip and AdamW, or skip the step on every rank when some rank's loss or
  // gradient was not finite; returns the pre-clip gradient norm.
  double optimizer_step(int64_t rollout_id, double lr) {
    const double norm = c_.train.clip_grad > 0 ? run_.params->clip_grad(c_.train.clip_grad) : run_.params->grad_norm();
    const bool finite = std::isfinite(norm);
    if (!finite && c_.train.on_nonfinite == "stop")
      fail(
          "rollout {}: the gradient norm is {} (non-finite loss or gradient on some rank); stopping as "
          "train.on_nonfinite = \"stop\" asks (set \"skip\" to skip such steps)",
          rollout_id, norm);
    if (finite && !c_.debug.skip_optimizer_step) run_.params->adamw_step(lr);
    if (!finite) {
      ++skipped_;
      run_.params->zero_grad();
      spdlog::warn("rollout {}: non-finite gradient norm {}; optimizer step skipped ({} so far)", rollout_id, norm,
                   skipped_);
    }
    return norm;
  }

  Run& run_;
  const config::Config& c_;
  const TrainCli& cli_;
  rl::LrSchedule lr_;
  int64_t global_step_ = 0;
  int64_t skipped_ = 0;
};

// A stop agreed before the first rollout: nothing new to checkpoint.
int preempted_at_start_up(const config::Config& config, bool root, int signal, const std::string& when) {
  spdlog::info("signal {} received during start-up: exiting {} (nothing new to checkpoint)", signal, when);
  if (root) write_status(config.run.out_dir, "preempted");
  return 0;
}

// The rollout dropped at a safe point: the state before it is checkpointed
// unless the newest checkpoint (or the start) already is that state.
int preempted_in_rollout(const config::Config& config, bool root, const RolloutAbandoned& stop, int64_t rollout_id,
                         int64_t committed_rollout, RunCheckpoints& checkpoints, int64_t global_step) {
  const int64_t total = config.train.num_rollouts;
  std::string saved = "nothing new to checkpoint";
  if (rollout_id > committed_rollout) {
    checkpoints.save(global_step, rollout_id);
    saved = fmt::format("checkpointed after rollout {}/{}", rollout_id, total);
  }
  spdlog::info("signal {} received: rollout {}/{} dropped {} (none of it trained); {}; exiting for requeue",
               stop.signal(), rollout_id + 1, total, stop.what(), saved);
  if (root) write_status(config.run.out_dir, "preempted");
  return 0;
}

// Rank 0's report page, starting from the rows of metrics.h5 before the
// step a resumed run continues at (read before the writer opens the file).
std::unique_ptr<RunReport> open_report(const Run& run, const std::string& deck_path, bool resumed, int64_t step) {
  const config::Config& c = run.config;
  ReportIdentity id{c.run.name,
                    deck_path,
                    run.deck_text,
                    build::git_commit(),
                    run.runtime->device().str(),
                    run.runtime->world().size,
                    at::get_num_threads(),
                    c.train.num_rollouts};
  const std::string path = (std::filesystem::path(c.run.out_dir) / "metrics.h5").string();
  io::MetricsTable earlier;
  if (resumed && std::filesystem::exists(path)) {
    io::MetricsTable all;
    try {
      all = io::read_metrics(path);
    } catch (const std::exception& e) {
      // The metrics writer sets a damaged file aside and starts a new one; the page's curves start there too.
      spdlog::warn("report: the earlier curves are not shown: {}", e.what());
    }
    for (size_t i = 0; i < all.steps.size() && all.steps[i] < step; ++i) {
      earlier.steps.push_back(all.steps[i]);
      for (const auto& [key, values] : all.series) earlier.series[key].push_back(values[i]);
    }
  }
  return std::make_unique<RunReport>(c.run.out_dir, std::move(id), earlier);
}

int train(const TrainCli& cli) {
  config::Config config = config::load_deck(cli.deck, cli.overrides);
  if (!cli.resume.empty()) config.checkpoint.resume = cli.resume;  // the flag overrides the deck's key
  check_trainable(config);
  check_out_dir(config);
  const StartedJob job = start_runtime(config, config.run.out_dir);
  const std::unique_ptr<dist::Runtime>& runtime = job.runtime;
  spdlog::info("ditrl train {} on {} rank(s), {} intra-op thread(s){}", cli.deck, runtime->world().size,
               at::get_num_threads(), config.run.deterministic ? ", deterministic: " + cpu_kernel_pins() : "");
  const bool root = runtime->world().rank == 0;
  // A signal since the process started (its handlers came before LibTorch's
  // static initializers): the output directory exists now, the model is not
  // built yet, which at real size takes longer than a launcher's kill grace.
  if (const int signal = agreed_stop_signal(runtime->host()))
    return preempted_at_start_up(config, root, signal, "before building the model");

  Run run = open_run(config, *runtime);
  Trainer trainer(run, cli);
  RunCheckpoints checkpoints(run, cli.allow_changed_deck);
  const int64_t first_rollout = checkpoints.resume(config.checkpoint.resume);
  trainer.resume_at(checkpoints.resumed_step());
  dist::Watchdog::mark_started();
  if (const int signal = agreed_stop_signal(run.runtime->host()))
    return preempted_at_start_up(config, root, signal,
                                 fmt::format("before rollout {}/{}", first_rollout + 1, config.train.num_rollouts));

  // The weights before any training, then every log.samples_every rollouts.
  const std::unique_ptr<SampleWriter> samples = open_sample_writer(run, first_rollout);
  if (samples && first_rollout == 0) samples->write(0);

  std::unique_ptr<RunReport> report;
  if (root) report = open_report(run, cli.deck, checkpoints.resumed(), trainer.global_step());
  std::unique_ptr<io::MetricsWriter> metrics;
  if (root)
    metrics = std::make_unique<io::MetricsWriter>(
        (std::filesystem::path(config.run.out_dir) / "metrics.h5").string(), run.deck_text,
        dist::device_identity(runtime->device(), config.run.device), checkpoints.resumed(), trainer.global_step());
  const shard::MemoryReport memory = run.params->memory_report();
  const double state_bytes = static_cast<double>(memory.masters + memory.moments + memory.grads + memory.compute);

  const int64_t total = config.train.num_rollouts;
  const auto run_start = Clock::now();
  int64_t committed_rollout = first_rollout;  // where the newest checkpoint (or the start) resumes
  for (int64_t rollout_id = first_rollout; rollout_id < total; ++rollout_id) {
    const auto start = Clock::now();
    std::vector<MetricRow> rows;
    try {
      rows = trainer.train_rollout(rollout_id);
    } catch (const RolloutAbandoned& stop) {
      return preempted_in_rollout(config, root, stop, rollout_id, committed_rollout, checkpoints,
                                  trainer.global_step());
    }
    const double seconds = seconds_since(start);
    const double eta = seconds_since(run_start) / static_cast<double>(rollout_id + 1 - first_rollout) *
                       static_cast<double>(total - rollout_id - 1);
    if (root)
      spdlog::info(
          progress_line(rollout_id, total, rows.front().values, rows.back().values, rows.size(), seconds, eta));

    // Every rank must agree to stop, whichever received the signal; the
    // same reduction carries the largest peak RSS (and on a GPU the largest
    // allocator peak) over ranks.
    const bool on_gpu = run.runtime->device().is_cuda();
    at::Tensor stop = at::tensor({static_cast<double>(stop_signal()), peak_rss_bytes(),
                                  on_gpu ? dist::peak_device_bytes(run.runtime->device()) : 0.0},
                                 at::kDouble);
    run.runtime->host().all_reduce(stop, dist::ReduceOp::Max);
    const bool last = rollout_id + 1 == total;
    const bool due = config.checkpoint.every > 0 && (rollout_id + 1) % config.checkpoint.every == 0;
    const bool signalled = stop[0].item<double>() > 0;
    const bool boxed = cli.max_rollouts > 0 && rollout_id + 1 - first_rollout >= cli.max_rollouts;
    const bool save = last || due || signalled || boxed;
    const double seconds_checkpoint = save ? checkpoints.save(trainer.global_step(), rollout_id + 1) : 0.0;
    if (save) committed_rollout = rollout_id + 1;
    // Rows go out after the checkpoint, so the last one of a rollout carries
    // its checkpoint time (the iteration's whole cost).
    rows.back().values["perf/checkpoint_seconds"] = seconds_checkpoint;
    for (MetricRow& r : rows) {
      r.values["perf/state_bytes"] = state_bytes;
      r.values["perf/peak_rss_bytes"] = stop[1].item<double>();
      if (on_gpu) r.values["perf/peak_device_bytes"] = stop[2].item<double>();
      if (metrics && r.step % config.metrics.every == 0) {
        metrics->write(r.step, r.values);
        report->add(r);
      }
    }
    if (samples && samples->due(rollout_id + 1)) samples->write(rollout_id + 1);
    if (report && save) report->write(rollout_id + 1, rollout_id + 1 - first_rollout, seconds_since(run_start));
    if ((signalled || boxed) && !last) {
      if (signalled)
        spdlog::info("signal {} received: checkpointed after rollout {}/{}; exiting for requeue",
                     static_cast<int>(stop[0].item<double>()), rollout_id + 1, total);
      else
        spdlog::info("--max-rollouts {} reached: checkpointed after rollout {}", cli.max_rollouts, rollout_id);
      if (root) write_status(config.run.out_dir, "preempted");
      return 0;
    }
  }
  if (root) write_status(config.run.out_dir, "complete");
  if (first_rollout >= total)
    spdlog::info("nothing to train: the run resumed at rollout {} and train.num_rollouts is {}", first_rollout, total);
  else
    spdlog::info("training complete: {} rollouts, {} optimizer steps, {:.1f} s", total - first_rollout,
                 trainer.global_step(), seconds_since(run_start));
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
                  "Resume from `latest` or `auto` (the newest checkpoint that verifies; auto starts when there is "
                  "none), a checkpoint path, or `none` (start over although OUT holds checkpoints)");
  sub->add_flag("--allow-changed-deck", cli->allow_changed_deck,
                "Resume although the deck changes keys that decide the trajectory (batching, seeds, model, latent "
                "grid, prompts) against the checkpoint's stored deck");
  sub->add_option("--trajectories", cli->trajectories,
                  "Train on rollouts from trajectory files (an external engine, or `ditrl rollout`) instead of "
                  "sampling; `{rollout}` in the path is replaced by the rollout id");
  sub->add_option("--max-rollouts", cli->max_rollouts,
                  "Run at most N rollouts in this invocation, then checkpoint and exit (resume with --resume latest)")
      ->check(CLI::NonNegativeNumber);
  sub->callback([cli, &selected] { selected = [cli] { return train(*cli); }; });
}

}  // namespace ditrl::app
