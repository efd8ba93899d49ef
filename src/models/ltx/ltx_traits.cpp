#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/ltx/ltx.hpp>

namespace ditrl::models {

namespace {

// ltx_core's LTX2Scheduler (the sampler whose sigmas LTX's DiT consumes,
// docs/algorithms.md §1.3(c)) with its defaults: max_shift 2.05, base_shift
// 0.95, stretch to terminal 0.1, tokens = F*H*W latent voxels.
diffusion::Schedule ltx_schedule(const diffusion::SchedulePresetOptions& p) {
  diffusion::Ltx2Options o;
  o.steps = p.steps;
  o.tokens = p.frames * p.height * p.width;
  return diffusion::ltx2_schedule(o);
}

// LTX configs also come from a checkpoint's own metadata (its "config" JSON),
// so `config_json` may name the single-file .safetensors checkpoint itself.
std::shared_ptr<Family> create_ltx(const FamilyOptions& o) {
  const std::string& path = o.config_json;
  if (path.empty()) return std::make_shared<LTX>(LtxConfig::preset(o.preset), o);
  const std::string suffix = ".safetensors";
  if (path.size() < suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::make_shared<LTX>(LtxConfig::from_json(json_config::read_file(path), path), o);
  const io::SafetensorsFile file(path);
  const auto it = file.metadata().find("config");
  if (it == file.metadata().end()) fail("{}: no __metadata__[\"config\"] to build the LTX model from", path);
  return std::make_shared<LTX>(LtxConfig::from_json(it->second, path + " __metadata__[\"config\"]", false), o);
}

std::string ltx_config_json(const Family& family) {
  return static_cast<const LTX&>(family).config().to_json();
}

std::optional<ActivationGeometry> ltx_activation_geometry(const Family& family, const LatentGrid& grid) {
  const LtxConfig& c = static_cast<const LTX&>(family).config();
  ActivationGeometry g;  // the video stream (the trainer runs no audio)
  g.tokens = grid.frames * grid.height * grid.width;
  g.text_tokens = c.text_tokens;
  g.dim = c.inner_dim();
  g.heads = c.num_attention_heads;
  g.ffn_dim = 4 * c.inner_dim();
  g.blocks = c.num_layers;
  return g;
}

}  // namespace

const FamilyTraits kLtxTraits{
    "ltx",                    // name
    false,                    // guided
    false,                    // second_expert
    false,                    // true_cfg
    ExportLayout::LtxCore,    // export_layout
    ltx_schedule,             // schedule
    create_ltx,               // create
    ltx_config_json,          // config_json
    ltx_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
