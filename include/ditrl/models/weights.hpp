#pragma once

// Parameters of an unsharded model by checkpoint name: validation of a
// checkpoint against the model, loading, the seeded init, and the cast to a
// forward dtype with the family's dtype overrides.

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::models {

// The checkpoint at `path` as `model` reads it: regrouped by
// Family::checkpoint_regrouping when `model` is a Family whose checkpoints
// come in another layout too.
io::Checkpoint open_checkpoint(const torch::nn::Module& model, const std::string& path);

// Checks the checkpoint's names (PEFT names resolved to canonical ones) and
// shapes against the model; throws one Error, naming the checkpoint, that
// lists every missing, unexpected, wrongly-shaped and wrongly-typed (not
// F32/BF16/F16/F64) tensor together. When
// `model` is a Family, stored names go through Family::checkpoint_name first
// (tensors it skips are neither loaded nor reported).
void validate_checkpoint(const torch::nn::Module& model, const io::Checkpoint& checkpoint);

// Canonical parameter name -> the name it is stored under in `checkpoint`
// (PEFT spellings and Family::checkpoint_name resolved; skipped tensors left out).
std::map<std::string, std::string> stored_names(const torch::nn::Module& model, const io::Checkpoint& checkpoint);

// validate_checkpoint, then copies every tensor into the model (converted to
// the parameter's dtype).
void load_weights(torch::nn::Module& model, const io::Checkpoint& checkpoint);

// Seeded init of every non-LoRA parameter, in registration order: tensors
// with >= 2 dims N(0, 1)/sqrt(fan_in), 1-D `*weight` 1 + 0.1 N(0, 1), other
// 1-D 0.1 N(0, 1) (the reference fixtures' rule: every weight matters).
void init_parameters(torch::nn::Module& model, int64_t seed);
// One parameter's value under that rule, drawn from `gen` (init_parameters
// draws every parameter in turn from one generator).
at::Tensor seeded_value(const std::string& name, at::IntArrayRef shape, at::Generator& gen);

// Casts every parameter and floating buffer to `forward`, except names an
// override pattern matches (the last matching rule sets the dtype). The
// unsharded counterpart of the precision plan.
void cast_parameters(torch::nn::Module& model, c10::ScalarType forward, const std::vector<DtypeOverride>& overrides);

// Parameters and persistent buffers under their checkpoint names.
io::NamedTensors state_tensors(const torch::nn::Module& model);

// A floating tensor holding NaN or +-Inf: a diverged run's weights, or a
// corrupted file, which every later number would silently inherit.
struct NonFinite {
  std::string name;
  int64_t nan = 0;
  int64_t inf = 0;
  int64_t numel = 0;
};
std::optional<NonFinite> find_nonfinite(const std::string& name, const at::Tensor& tensor);
// "a.weight (3 NaN, 0 Inf of 64), ..." (the first 10, then a count).
std::string describe_nonfinite(const std::vector<NonFinite>& found);

}  // namespace ditrl::models
