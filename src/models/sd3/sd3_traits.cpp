#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/sd3/sd3.hpp>

namespace ditrl::models {

namespace {

// SD3.5-medium's FlowMatchEuler: static shift 3.0 on the scheduler's own
// float64 grid (the pipeline passes no sigmas; docs/algorithms.md §1.2).
diffusion::Schedule sd3_schedule(const diffusion::SchedulePresetOptions& p) {
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  o.shift = 3.0;
  return diffusion::flow_match_schedule(o);
}

std::shared_ptr<Family> create_sd3(const FamilyOptions& o) {
  const SD3Config config = o.config_json.empty()
                               ? SD3Config::preset(o.preset)
                               : SD3Config::from_json(json_config::read_file(o.config_json), o.config_json);
  return std::make_shared<SD3>(config, o);
}

std::string sd3_config_json(const Family& family) {
  return static_cast<const SD3&>(family).config().to_json();
}

std::optional<ActivationGeometry> sd3_activation_geometry(const Family& family, const LatentGrid& grid) {
  const SD3Config& c = static_cast<const SD3&>(family).config();
  ActivationGeometry g = joint_image_geometry(c, grid);
  g.image_only_attention = !c.dual_attention_layers.empty();
  return g;
}

}  // namespace

const FamilyTraits kSd3Traits{
    "sd3",                    // name
    true,                     // guided
    false,                    // second_expert
    false,                    // true_cfg
    ExportLayout::Diffusers,  // export_layout
    sd3_schedule,             // schedule
    create_sd3,               // create
    sd3_config_json,          // config_json
    sd3_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
