#include <ditrl/error.hpp>
#include <ditrl/rl/parity_dump.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace ditrl::rl {

namespace {

bool contains(const std::vector<int64_t>& values, int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Records the rows of the chosen samples of one forward batch.
class BatchTap : public models::Tap {
 public:
  struct Chosen {
    std::string key;
    int64_t row;
  };
  BatchTap(io::TensorDumpWriter& writer, std::string side, std::vector<Chosen> chosen, int64_t batch)
      : writer_(writer), side_(std::move(side)), chosen_(std::move(chosen)), batch_(batch) {}
  // Flushed per forward so a run that dies later leaves a readable dump.
  ~BatchTap() override {
    try {
      writer_.flush();
    } catch (const std::exception& e) {
      spdlog::warn("parity dump {}: flush failed: {}", writer_.path(), e.what());
    }
  }

  void record(const std::string& module, const std::string& name, const at::Tensor& value) override {
    if (!value.defined()) return;
    for (const Chosen& c : chosen_) writer_.write(side_, c.key, module, name, sample_rows(value, c.row, batch_));
  }

 private:
  io::TensorDumpWriter& writer_;
  std::string side_;
  std::vector<Chosen> chosen_;
  int64_t batch_;
};

}  // namespace

ParityDump::ParityDump(const std::string& path, ParityDumpOptions options)
    : writer_(path), options_(std::move(options)) {}

std::string ParityDump::key(int64_t rollout, int64_t sample, int64_t step) {
  return fmt::format("r{}_s{}_t{}", rollout, sample, step);
}

std::unique_ptr<models::Tap> ParityDump::tap(DumpSide side, int64_t rollout, const std::vector<int64_t>& samples,
                                             const std::vector<int64_t>& steps, bool trained) {
  if (samples.size() != steps.size())
    fail("parity dump: {} sample ids for {} steps (one of each per batch row)", samples.size(), steps.size());
  if (!contains(options_.rollouts, rollout)) return nullptr;
  std::vector<BatchTap::Chosen> chosen;
  for (size_t row = 0; row < samples.size(); ++row) {
    const bool step_chosen = options_.steps.empty() ? trained : contains(options_.steps, steps[row]);
    if (step_chosen && contains(options_.samples, samples[row]))
      chosen.push_back({key(rollout, samples[row], steps[row]), static_cast<int64_t>(row)});
  }
  if (chosen.empty()) return nullptr;
  return std::make_unique<BatchTap>(writer_, side == DumpSide::Rollout ? "rollout" : "train", std::move(chosen),
                                    static_cast<int64_t>(samples.size()));
}

at::Tensor sample_rows(const at::Tensor& value, int64_t row, int64_t batch) {
  if (value.dim() == 0 || value.size(0) % batch != 0) return value;
  std::vector<int64_t> rows;
  for (int64_t r = row; r < value.size(0); r += batch) rows.push_back(r);
  return value.detach().index_select(0, at::tensor(rows, at::kLong).to(value.device()));
}

void record_sde_step(const models::ForwardContext& ctx, const diffusion::StepResult& step) {
  if (!ctx.tap) return;
  ctx.record("sde", "mean", step.mean);
  ctx.record("sde", "std", step.noise_std);
  ctx.record("sde", "log_prob", step.log_prob);
}

}  // namespace ditrl::rl
