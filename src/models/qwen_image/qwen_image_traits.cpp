#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/json_config.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>

namespace ditrl::models {

namespace {

// The pipeline passes sigmas = linspace(1, 1/n, n) (float64 -> fp32), dynamic
// exponential shift with mu from the packed image sequence length (H/2 * W/2
// latent tokens; base 256 / max 8192 tokens, shift 0.5 / 0.9) and
// shift_terminal 0.02 (scheduler config of docs/algorithms.md §1.2, [I] in the spec).
diffusion::Schedule qwen_image_schedule(const diffusion::SchedulePresetOptions& p) {
  if (p.height % 2 != 0 || p.width % 2 != 0)
    fail("qwen_image schedule: the latent grid {}x{} must be even (2x2 packing)", p.height, p.width);
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  const int64_t seq_len = (p.height / 2) * (p.width / 2);
  o.dynamic =
      diffusion::DynamicShift{diffusion::resolution_mu(seq_len, diffusion::ResolutionShift{256, 8192, 0.5, 0.9}),
                              diffusion::TimeShiftType::Exponential};
  o.shift_terminal = 0.02;
  o.sigmas = diffusion::numpy_linspace(1.0, 1.0 / static_cast<double>(p.steps), p.steps);
  return diffusion::flow_match_schedule(o);
}

std::shared_ptr<Family> create_qwen_image(const FamilyOptions& o) {
  const QwenImageConfig config = o.config_json.empty()
                                     ? QwenImageConfig::preset(o.preset)
                                     : QwenImageConfig::from_json(json_config::read_file(o.config_json), o.config_json);
  return std::make_shared<QwenImage>(config, o);
}

std::string qwen_image_config_json(const Family& family) {
  return static_cast<const QwenImage&>(family).config().to_json();
}

std::optional<ActivationGeometry> qwen_image_activation_geometry(const Family& family, const LatentGrid& grid) {
  const QwenImageConfig& c = static_cast<const QwenImage&>(family).config();
  ActivationGeometry g = joint_image_geometry(c, grid);
  g.masked = true;
  return g;
}

}  // namespace

const FamilyTraits kQwenImageTraits{
    "qwen_image",                    // name
    true,                            // guided
    false,                           // second_expert
    true,                            // true_cfg
    ExportLayout::Diffusers,         // export_layout
    qwen_image_schedule,             // schedule
    create_qwen_image,               // create
    qwen_image_config_json,          // config_json
    qwen_image_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
