#pragma once

// Train/rollout parity dumps ([debug] dump = true): the rollout forward and
// the training forward of chosen (rollout, sample, step) keys record their
// named tensors into the rank's dump file (io/tensor_dump.hpp) under
// /rollout/<key>/... and /train/<key>/..., key "r<rollout>_s<sample>_t<step>",
// for `ditrl align`. A forward runs a batch of samples (a micro-group, with
// CFG a joint [pos; neg] batch of twice its size): each chosen sample keeps
// its own rows, so both sides store the same tensors whatever else shared
// the batch. Forwards holding no chosen sample get no tap (zero cost).

#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/io/tensor_dump.hpp>
#include <ditrl/models/unit.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rl {

enum class DumpSide { Rollout, Train };

struct ParityDumpOptions {
  std::vector<int64_t> rollouts{0};
  std::vector<int64_t> samples{0};  // global sample ids
  std::vector<int64_t> steps;       // empty = every trained (SDE) step
};

class ParityDump {
 public:
  ParityDump(const std::string& path, ParityDumpOptions options);

  // The tap for one forward whose batch row i is sample `samples[i]` at step
  // `steps[i]`, or nullptr when no row is chosen. `trained`: the step is an
  // SDE step (the default selection).
  std::unique_ptr<models::Tap> tap(DumpSide side, int64_t rollout, const std::vector<int64_t>& samples,
                                   const std::vector<int64_t>& steps, bool trained);

  static std::string key(int64_t rollout, int64_t sample, int64_t step);
  const std::string& path() const { return writer_.path(); }

 private:
  io::TensorDumpWriter writer_;
  ParityDumpOptions options_;
};

// Row `row` of a batch of `batch` samples in `value`: rows row, row + batch,
// ... when the leading dimension is a multiple of `batch` (a joint CFG batch
// gives two), else the whole tensor (not batched).
at::Tensor sample_rows(const at::Tensor& value, int64_t row, int64_t batch);

// The transition's mean, std and log-prob as module "sde".
void record_sde_step(const models::ForwardContext& ctx, const diffusion::StepResult& step);

}  // namespace ditrl::rl
