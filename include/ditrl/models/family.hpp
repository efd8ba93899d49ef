#pragma once

// A model family (SD3/SD3.5, Wan2.2, LTX-2.3, Qwen-Image, FLUX.1) is a torch module
// whose named_parameters() are the checkpoint names, plus what the trainer
// and the sampler need to drive it: the velocity forward in the timestep
// domain its DiT consumes, wrap units, LoRA targets, dtype overrides, CFG.

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/attention_backend.hpp>
#include <ditrl/models/unit.hpp>
#include <ditrl/precision/dtype.hpp>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::models {

// Which rollout array the DiT reads: trajectory timesteps t in [0, 1000]
// (SD3, Wan) or the sigma snapshot in [0, 1] (LTX, Qwen-Image, FLUX.1). Both arrays
// are always passed; a family never derives one from the other.
enum class TimestepDomain { Timestep, Sigma };

// Conditioning of a batch, by the reference forward's argument names
// (e.g. "encoder_hidden_states", "pooled_projections",
// "encoder_hidden_states_mask").
struct Cond {
  std::map<std::string, at::Tensor> tensors;
  // Host copies of the masks (the tensors named "*_mask"), kept by `to` and
  // carried by the row selections: a family decides from them whether a mask
  // masks anything (attention given a mask runs another kernel) without
  // reading the device inside the forward. (= {}: a Cond brace-initialised
  // with its tensors only is complete.)
  std::map<std::string, at::Tensor> host = {};

  bool has(const std::string& name) const { return tensors.count(name) > 0 && tensors.at(name).defined(); }
  // Throws naming the missing tensor and the ones present.
  const at::Tensor& at(const std::string& name) const;
  // The host copy of tensor `name`, else the tensor itself (a Cond built on
  // its device, as tests do: reading that one waits for the device).
  const at::Tensor& on_host(const std::string& name) const;
  // Every tensor on `device`; the masks keep a host copy.
  Cond to(c10::Device device) const;
  // Rows [begin, begin + count) of every tensor.
  Cond narrow(int64_t begin, int64_t count) const;
  // The rows `index` (a host int64 tensor) of every tensor.
  Cond index_select(const at::Tensor& index) const;
  // [first; second] along the batch, for each tensor of `first` (throws when
  // `second` lacks one).
  static Cond cat(const Cond& first, const Cond& second);
};

// One conditioning tensor per prompt, for synthetic prompts and for
// validating a prompt dataset against the family.
struct CondSpec {
  std::string name;
  std::vector<int64_t> shape;  // per prompt, without the batch dimension
  c10::ScalarType dtype = c10::ScalarType::Float;
};

// Latent grid in VAE latent units; image families use frames = 1.
struct LatentGrid {
  int64_t frames = 1;
  int64_t height = 16;
  int64_t width = 16;
  double fps = 24.0;  // frame rate of the video (LTX RoPE time coordinates)
};

struct DtypeOverride {
  std::string pattern;  // glob over canonical parameter names
  c10::ScalarType dtype = c10::ScalarType::Float;
};

struct GuidanceOptions {
  double scale = 1.0;
  std::optional<double> scale_2;         // Wan2.2 low-noise expert
  std::optional<double> true_cfg_scale;  // Qwen-Image
};

struct LoraOptions {
  bool enabled = false;
  int64_t rank = 32;
  double alpha = 64.0;
  std::vector<std::string> targets;  // empty = the family's default targets
  std::string init = "gaussian";     // "gaussian" | "kaiming"
  int64_t seed = 0;
};

struct FamilyOptions {
  std::string family;  // "sd3" | "wan" | "ltx" | "qwen_image" | "flux"
  std::string preset = "tiny";
  std::string config_json;         // path of an optional config.json (reference format) replacing the preset
  c10::Device device = c10::kCPU;  // where parameters live; c10::kMeta: shapes only, nothing allocated
  // Sliced loading: the parameters stay on the meta device (no rank ever
  // holds the whole model) while buffers (SD3's pos_embed) and LoRA adapters
  // are materialised on `device`; shard::ShardedParams then reads each rank's
  // slices from a models::ParameterSource (the seeded init or the weights).
  bool sliced = false;
  // With `sliced`: tables indexed by the latent grid hold only the part that
  // `latent_grid`'s forward reads (SD3's pos_embed: the centre crop, not all
  // pos_embed_max_size^2 rows). For training, which runs at the deck's grid;
  // a forward at another grid that reads outside it is an error. Export
  // leaves it off (it writes the whole table).
  bool crop_to_grid = false;
  int64_t experts = 0;    // expert DiTs (Wan2.2 A14B: 2); 0 = what the preset or config.json says
  int64_t init_seed = 0;  // seeded init when no weights are loaded
  AttentionBackend attention = AttentionBackend::Math;
  LoraOptions lora;
  precision::InputPolicy inputs;  // boundary casts applied inside noise_pred
  // Grid of the latents noise_pred receives, for families whose latents are
  // token sequences that do not carry it (LTX builds its RoPE positions from it).
  LatentGrid latent_grid;

  // fp32 on `device` (the meta device when sliced): what a family builds its parameters with.
  at::TensorOptions parameter_options() const {
    return at::TensorOptions().dtype(at::kFloat).device(sliced ? c10::Device(c10::kMeta) : device);
  }
  // fp32 on `device`: buffers a family computes, and LoRA adapters.
  at::TensorOptions buffer_options() const { return at::TensorOptions().dtype(at::kFloat).device(device); }
};

class Family : public torch::nn::Module {
 public:
  virtual std::string family_name() const = 0;
  virtual TimestepDomain timestep_domain() const = 0;

  // Velocity prediction for latents in the family's native layout.
  // `timesteps` and `sigmas` are (B,) fp32 values taken from the rollout's
  // snapshots at the same indices; the family reads the one its model
  // consumes and applies the input policy to its boundary inputs.
  virtual at::Tensor noise_pred(const at::Tensor& latents, const at::Tensor& timesteps, const at::Tensor& sigmas,
                                const Cond& cond, const ForwardContext& ctx) = 0;

  // The reference forward under its own argument names (fixture and
  // `ditrl forward` inputs; JSON sidecar values in `extra_json`); returns the
  // reference output names ("output", or "output.video"/"output.audio").
  virtual std::map<std::string, at::Tensor> reference_forward(const std::map<std::string, at::Tensor>& inputs,
                                                              const std::string& extra_json,
                                                              const ForwardContext& ctx) = 0;

  // Transformer blocks in execution order; everything else is the root.
  virtual std::vector<WrapUnit> wrap_units() = 0;
  virtual std::vector<std::string> default_lora_targets() const = 0;
  // Parameters the family keeps in a dtype other than the forward dtype.
  virtual std::vector<DtypeOverride> default_overrides() const = 0;
  virtual precision::InputPolicy default_input_policy(c10::ScalarType forward) const;

  virtual bool supports_cfg() const { return true; }
  // A guidance-distilled model (FLUX.1-dev) embeds the guidance scale: it
  // reads GuidanceOptions::scale as the conditioning tensor `guidance` (B,),
  // which models/guided.hpp adds to every forward, and runs CFG only as true CFG.
  virtual bool embeds_guidance() const { return false; }
  // The guided velocity from the positive and negative predictions.
  virtual at::Tensor cfg_combine(const at::Tensor& pos, const at::Tensor& neg, const GuidanceOptions& g,
                                 double timestep) const;
  // The expert DiT that denoises at trajectory timestep t (Wan2.2 A14B: 0 or
  // 1); 0 for a family with a single DiT.
  virtual size_t expert_for(double /*timestep*/) const { return 0; }
  // The scale used at a step (Wan2.2 switches with the expert phase).
  virtual double guidance_scale(const GuidanceOptions& g, double /*timestep*/) const { return g.scale; }

  virtual std::vector<int64_t> latent_shape(int64_t batch, const LatentGrid& grid) const = 0;
  // An error naming parallel.sequence_parallel unless the forward can split
  // `grid`'s sequence over `ranks` ranks (models/ulysses.hpp); families
  // without a sequence-parallel forward reject every ranks > 1.
  virtual void check_sequence_parallel(int64_t ranks, const LatentGrid& grid) const;
  virtual std::vector<CondSpec> cond_spec() const = 0;

  // The modules that hold one expert checkpoint each (model.weights,
  // model.weights_2: Wan2.2 A14B's `transformer` and `transformer_2`), whose
  // parameter names are the expert checkpoint's names; empty for a family
  // with a single DiT, which loads one checkpoint into the whole model.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> expert_modules() { return {}; }
  // The parameter name of a tensor stored as `stored` in a checkpoint, or
  // nullopt for a tensor of the file that is not part of this model (skipped
  // on load; e.g. the VAE of a single-file LTX checkpoint).
  virtual std::optional<std::string> checkpoint_name(const std::string& stored) const { return stored; }
  // How a checkpoint in a layout other than the model's own (Black Forest
  // Labs' single files, which fuse q, k and v) maps onto the parameters, as
  // a Checkpoint::regroup table; empty for a checkpoint already under the
  // model's names. Applied by models::open_checkpoint.
  virtual std::map<std::string, std::vector<io::StoredRows>> checkpoint_regrouping(const io::Checkpoint&) const {
    return {};
  }
};

// Builds a family from options (preset or config.json, LoRA adapters
// attached, seeded init or meta shapes). Unknown family -> error listing the
// known ones.
std::shared_ptr<Family> create_family(const FamilyOptions& options);
std::vector<std::string> family_names();

// Refuses a forward input whose shape is not `shape` (-1: any size there),
// naming the family, the input and both shapes.
void require_input_shape(const char* family, const at::Tensor& t, const char* name, const std::vector<int64_t>& shape);

}  // namespace ditrl::models
