#pragma once

// What code outside models/ asks of a family by its name, before or without
// building one (which deck options it accepts, the sigma schedule its sampler
// uses, the layout its exports take), and of a built one (its config file,
// its activation sizes). Each family writes its record once, in its folder
// (models/<family>/<family>_traits.cpp); the registry in family_traits.cpp is
// the one place that maps a family name to a record.

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::diffusion {
struct Schedule;
struct SchedulePresetOptions;
}  // namespace ditrl::diffusion

namespace ditrl::models {

class Family;
struct FamilyOptions;
struct LatentGrid;
struct ActivationGeometry;

// The files `ditrl export` writes for a family.
enum class ExportLayout {
  // diffusers: sharded diffusion_pytorch_model*.safetensors beside a
  // config.json; LoRA as pytorch_lora_weights.safetensors and ComfyUI's file.
  Diffusers,
  // ltx_core: one file, the DiT under model.diffusion_model. and its config in
  // the metadata; LoRA as ltx_lora.safetensors.
  LtxCore,
};

struct FamilyTraits {
  const char* name;
  // Classifier-free guidance and negative prompts (LTX trains unguided).
  bool guided;
  // A second, low-noise expert DiT: model.weights_2 and rollout.guidance_scale_2 (Wan2.2 A14B).
  bool second_expert;
  // Qwen-Image's true-CFG scale (rollout.true_cfg_scale).
  bool true_cfg;
  ExportLayout export_layout;
  // The family's sampler preset without a [rollout] shift (see family_schedule).
  diffusion::Schedule (*schedule)(const diffusion::SchedulePresetOptions& options);
  // Builds the model from options (preset or config.json), before init and LoRA.
  std::shared_ptr<Family> (*create)(const FamilyOptions& options);
  // The architecture of `family` (built by `create`) as the config its
  // reference loader reads: the diffusers config.json (one expert's for a
  // two-expert Wan2.2), for LTX-2 ltx_core's checkpoint-metadata config
  // ({"transformer": {...}}). Written next to exported weights so that
  // `from_pretrained(folder)` (or ltx_core) builds the same model.
  std::string (*config_json)(const Family& family);
  // The sizes `ditrl plan` models activation memory from
  // (models/activation_memory.hpp); nullopt for a family it has no model of.
  std::optional<ActivationGeometry> (*activation_geometry)(const Family& family, const LatentGrid& grid);
};

// The record of family `name`, or nullptr for a name no family has.
const FamilyTraits* find_family_traits(const std::string& name);
// The record of a built family.
const FamilyTraits& traits_of(const Family& family);
// Every family's record, in the order the deck lists them.
const std::vector<const FamilyTraits*>& family_registry();
// The families' names in the deck's order (model.family's allowed values);
// family_names() (models/family.hpp) sorts them.
std::vector<std::string> deck_family_names();

// The sigma schedule family `family`'s rollout samples on, from the deck's
// [rollout] steps/shift and latent grid: with a shift, the plain static-shift
// FlowMatchEuler grid for every family; without, the family's preset. An
// unknown name is an error listing the known ones.
diffusion::Schedule family_schedule(const std::string& family, const diffusion::SchedulePresetOptions& options);

}  // namespace ditrl::models
