#pragma once

// Prompt conditioning for a run: an HDF5 prompt-embedding dataset or a seeded
// synthetic generator, both read row by row so every rank loads only the
// prompts its samples use. Dataset layout (written by `ditrl encode-prompts`
// or write_prompt_dataset):
//   /text              [N] variable-length UTF-8 prompt strings
//   /cond/<name>       [N, ...] one dataset per conditioning tensor the family
//                      reads (e.g. encoder_hidden_states, pooled_projections,
//                      encoder_hidden_states_mask)
//   /negative/<name>   [1, ...] optional negative-prompt conditioning for CFG
//                      (absent: zeros, and all-ones masks)
//   attributes         free-form provenance (encoder identity, family)

#include <ditrl/models/family.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rollout {

class PromptSource {
 public:
  virtual ~PromptSource() = default;
  virtual int64_t size() const = 0;
  // The conditioning of prompts `indices`, stacked along dim 0.
  virtual models::Cond fetch(const std::vector<int64_t>& indices) const = 0;
  // The negative prompt's conditioning repeated `count` times.
  virtual models::Cond negative(int64_t count) const = 0;
  virtual std::string text(int64_t index) const = 0;
};

// Opens a prompt dataset and checks it holds every tensor of `spec` with the
// per-prompt shape and dtype the family expects (errors name file and tensor).
std::unique_ptr<PromptSource> open_prompt_dataset(const std::string& path, const std::vector<models::CondSpec>& spec);

// `count` prompts whose float tensors are N(0, 1) draws keyed by
// stable_hash("synthetic_prompt", seed, index) and whose masks are all ones.
std::unique_ptr<PromptSource> synthetic_prompts(const std::vector<models::CondSpec>& spec, int64_t count, int64_t seed);

void write_prompt_dataset(const std::string& path, const std::vector<std::string>& texts, const models::Cond& cond,
                          const models::Cond& negative, const std::map<std::string, std::string>& attributes);

// The prompts of a rollout: positions [rollout_id * batch, +batch) of an
// endless sequence of per-epoch permutations of the dataset, each keyed by
// stable_hash("prompt_order", seed, epoch). Depends only on the seed and the
// rollout id, so a resumed run (on any rank count) continues the same order.
std::vector<int64_t> rollout_prompts(int64_t dataset_size, int64_t seed, int64_t rollout_id, int64_t batch);

}  // namespace ditrl::rollout
