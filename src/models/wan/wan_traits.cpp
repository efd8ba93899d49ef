#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/wan/wan.hpp>

namespace ditrl::models {

namespace {

// The spec does not pin Wan2.2's RL sampler. The reference Wan2.2 sampler is
// flow-UniPC with int64 timesteps, which has no SDE log-prob; the SDE kernels
// need a FlowMatchEuler grid, so wan samples on FlowMatchEuler with
// Wan2.2-T2V-A14B's sample_shift 12.0 (wan/configs/wan_t2v_A14B.py) applied as
// a static shift. [rollout] shift overrides it.
diffusion::Schedule wan_schedule(const diffusion::SchedulePresetOptions& p) {
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  o.shift = 12.0;
  return diffusion::flow_match_schedule(o);
}

std::shared_ptr<Family> create_wan(const FamilyOptions& o) {
  const WanConfig config = o.config_json.empty()
                               ? WanConfig::preset(o.preset)
                               : WanConfig::from_json(json_config::read_file(o.config_json), o.config_json);
  return std::make_shared<Wan>(config, o);
}

std::string wan_config_json(const Family& family) {
  return static_cast<const Wan&>(family).config().to_json();
}

std::optional<ActivationGeometry> wan_activation_geometry(const Family& family, const LatentGrid& grid) {
  const WanConfig& c = static_cast<const Wan&>(family).config();
  ActivationGeometry g;  // one expert runs per forward
  g.tokens = grid.frames / c.patch_size[0] * (grid.height / c.patch_size[1]) * (grid.width / c.patch_size[2]);
  g.text_tokens = c.text_tokens;
  g.dim = c.inner_dim();
  g.heads = c.num_attention_heads;
  g.ffn_dim = c.ffn_dim;
  g.blocks = c.num_layers;
  return g;
}

}  // namespace

const FamilyTraits kWanTraits{
    "wan",                    // name
    true,                     // guided
    true,                     // second_expert
    false,                    // true_cfg
    ExportLayout::Diffusers,  // export_layout
    wan_schedule,             // schedule
    create_wan,               // create
    wan_config_json,          // config_json
    wan_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
