// Resuming a training run from a checkpoint and saving its state.

#include <ditrl/app/run_checkpoints.hpp>
#include <ditrl/io/checkpoint.hpp>

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

namespace ditrl::app {

int64_t RunCheckpoints::resume(const std::string& which) {
  const config::Config& c = run_.config;
  std::string resume = which;
  if (resume == "auto")
    resume = std::filesystem::exists(std::filesystem::path(c.run.out_dir) / "checkpoints" / "latest") ? "latest" : "";
  if (resume.empty()) return 0;
  const std::string path = io::resolve_checkpoint(c.run.out_dir, resume);
  const io::CheckpointMeta meta = io::load_checkpoint(path, training_state(run_), run_.runtime->io_comm());
  run_.params->refresh_compute();
  run_.params->set_step_count(meta.adam_step);
  run_.algorithm->resumed(meta.rollout_id);
  resumed_ = true;
  step_ = meta.step;
  spdlog::info("resumed from {} (written by {} rank(s)): rollout {}, optimizer step {}", path, meta.world_size,
               meta.rollout_id, meta.step);
  return meta.rollout_id;
}

double RunCheckpoints::save(int64_t global_step, int64_t next_rollout) {
  const auto start = std::chrono::steady_clock::now();
  const config::Config& c = run_.config;
  const io::CheckpointMeta meta{global_step,
                                next_rollout,
                                run_.runtime->world().size,
                                run_.params->step_count(),
                                next_rollout * c.rollout.batch,
                                run_.deck_text};
  const std::string path =
      io::save_checkpoint(c.run.out_dir, training_state(run_), meta, c.checkpoint.keep, run_.runtime->io_comm());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("checkpoint {} ({:.2f} s)", path, seconds);
  return seconds;
}

}  // namespace ditrl::app
