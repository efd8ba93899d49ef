#pragma once

// Preview samples while a run trains ([log] samples_every, docs/samples.md):
// K fixed prompts (a seeded choice from the dataset) with fixed noise,
// sampled with the deterministic ODE of the rollout's schedule and guidance
// by the current weights, scored by the run's reward, shown through the
// family's latent preview or decoded by [log] decoder's VAE module. Every rank samples its share of the K (the
// weights are sharded, so the forwards are collective); rank 0 writes
// OUT/samples/rollout-NNNNNN.png (a grid) or .webp (video samples side by
// side, animated) and a line of OUT/samples/index.jsonl. Its generators are
// its own and it trains nothing, so the run's metrics keep their bits.

#include <ditrl/app/run.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/rollout/decoder.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::app {

class SampleWriter {
 public:
  // Collective. `first_rollout`: where the run starts (index lines after it,
  // from a run that went past its checkpoint, are dropped).
  SampleWriter(Run& run, int64_t first_rollout);

  // After `rollouts_done` rollouts: every samples_every, and after the last.
  bool due(int64_t rollouts_done) const;
  // Collective over every rank; rank 0 writes the file and its index line.
  void write(int64_t rollouts_done);

 private:
  // The K samples' pixels, each [F, h, w, 3] uint8 (F = 1 for images).
  std::vector<at::Tensor> pictures(const at::Tensor& finals);
  std::string index_line(int64_t rollouts_done, const std::string& file, const at::Tensor& rewards) const;

  Run& run_;
  models::LatentRgbFactors factors_;
  std::optional<rollout::Decoder> decoder_;  // [log] decoder; else the latent preview
  std::vector<int64_t> prompts_;             // the K prompt indices
  int64_t per_rank_ = 0;                     // samples each sample group draws (K padded to a multiple of the groups)
  int64_t microgroup_ = 1;
  bool video_ = false;
  std::string dir_;                 // OUT/samples
  std::vector<std::string> index_;  // rank 0: the lines of index.jsonl
};

// nullptr unless [log] samples_every > 0. Collective.
std::unique_ptr<SampleWriter> open_sample_writer(Run& run, int64_t first_rollout);

}  // namespace ditrl::app
