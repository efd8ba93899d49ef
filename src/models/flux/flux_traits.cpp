#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/flux/flux.hpp>
#include <ditrl/models/json_config.hpp>

namespace ditrl::models {

namespace {

// FluxPipeline with FLUX.1-dev's scheduler config (use_dynamic_shifting,
// base_image_seq_len 256, max_image_seq_len 4096, base_shift 0.5, max_shift
// 1.15, exponential time shift, no terminal stretch): sigmas =
// linspace(1, 1/n, n), shifted with mu = calculate_shift of the packed image
// sequence length (H/2 * W/2 latent tokens). FLUX.1-schnell's scheduler
// config turns the dynamic shift off (shift 1.0), so its sigmas are the
// linspace itself; schnell is the timestep-distilled model without a guidance
// embedder, which is how a config.json shows it.
diffusion::Schedule flux_schedule(const diffusion::SchedulePresetOptions& p) {
  if (p.height % 2 != 0 || p.width % 2 != 0)
    fail("flux schedule: the latent grid {}x{} must be even (2x2 packing)", p.height, p.width);
  const FluxConfig model = p.config_json.empty()
                               ? FluxConfig::preset(p.preset)
                               : FluxConfig::from_json(json_config::read_file(p.config_json), p.config_json);
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  const int64_t seq_len = (p.height / 2) * (p.width / 2);
  if (model.guidance_embeds)
    o.dynamic =
        diffusion::DynamicShift{diffusion::resolution_mu(seq_len, diffusion::ResolutionShift{256, 4096, 0.5, 1.15}),
                                diffusion::TimeShiftType::Exponential};
  o.sigmas = diffusion::numpy_linspace(1.0, 1.0 / static_cast<double>(p.steps), p.steps);
  return diffusion::flow_match_schedule(o);
}

std::shared_ptr<Family> create_flux(const FamilyOptions& o) {
  const FluxConfig config = o.config_json.empty()
                                ? FluxConfig::preset(o.preset)
                                : FluxConfig::from_json(json_config::read_file(o.config_json), o.config_json);
  return std::make_shared<Flux>(config, o);
}

std::string flux_config_json(const Family& family) {
  return static_cast<const Flux&>(family).config().to_json();
}

std::optional<ActivationGeometry> flux_activation_geometry(const Family& family, const LatentGrid& grid) {
  const FluxConfig& c = static_cast<const Flux&>(family).config();
  ActivationGeometry g;
  g.tokens = (grid.height / 2) * (grid.width / 2);
  g.text_tokens = c.text_tokens;
  g.dim = c.inner_dim();
  g.heads = c.num_attention_heads;
  g.ffn_dim = 4 * c.inner_dim();
  g.blocks = c.num_layers + c.num_single_layers;
  g.joint = true;
  return g;
}

}  // namespace

const FamilyTraits kFluxTraits{
    "flux",                    // name
    true,                      // guided
    false,                     // second_expert
    true,                      // true_cfg
    ExportLayout::Diffusers,   // export_layout
    flux_schedule,             // schedule
    create_flux,               // create
    flux_config_json,          // config_json
    flux_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
