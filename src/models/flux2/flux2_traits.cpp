#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/activation_memory.hpp>
#include <ditrl/models/flux2/flux2.hpp>
#include <ditrl/models/json_config.hpp>

namespace ditrl::models {

namespace {

// Flux2Pipeline's compute_empirical_mu (diffusers 0.42.1), in its double
// arithmetic: mu fitted to the packed image tokens and the number of steps,
// linear in both up to 4300 tokens, then in the tokens alone.
double flux2_empirical_mu(int64_t image_seq_len, int64_t steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double seq = static_cast<double>(image_seq_len);
  if (image_seq_len > 4300) return a2 * seq + b2;
  const double m_200 = a2 * seq + b2;
  const double m_10 = a1 * seq + b1;
  const double a = (m_200 - m_10) / 190.0;
  const double b = m_200 - 200.0 * a;
  return a * static_cast<double>(steps) + b;
}

// The pipelines pass sigmas = linspace(1, 1/n, n) and mu from the packed
// sequence length (H/2 * W/2 tokens of a VAE grid H x W); the scheduler
// config (FlowMatchEulerDiscreteScheduler of FLUX.2-dev and [klein]) shifts
// them exponentially, with no terminal stretch.
diffusion::Schedule flux2_schedule(const diffusion::SchedulePresetOptions& p) {
  if (p.height % 2 != 0 || p.width % 2 != 0)
    fail("flux2 schedule: the latent grid {}x{} must be even (2x2 patchify)", p.height, p.width);
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  o.dynamic = diffusion::DynamicShift{flux2_empirical_mu((p.height / 2) * (p.width / 2), p.steps),
                                      diffusion::TimeShiftType::Exponential};
  o.sigmas = diffusion::numpy_linspace(1.0, 1.0 / static_cast<double>(p.steps), p.steps);
  return diffusion::flow_match_schedule(o);
}

std::shared_ptr<Family> create_flux2(const FamilyOptions& o) {
  const Flux2Config config = o.config_json.empty()
                                 ? Flux2Config::preset(o.preset)
                                 : Flux2Config::from_json(json_config::read_file(o.config_json), o.config_json);
  return std::make_shared<Flux2>(config, o);
}

std::string flux2_config_json(const Family& family) {
  return static_cast<const Flux2&>(family).config().to_json();
}

std::optional<ActivationGeometry> flux2_activation_geometry(const Family& family, const LatentGrid& grid) {
  const Flux2Config& c = static_cast<const Flux2&>(family).config();
  ActivationGeometry g;
  g.tokens = (grid.height / 2) * (grid.width / 2);
  g.text_tokens = c.text_tokens;
  g.dim = c.inner_dim();
  g.heads = c.num_attention_heads;
  g.ffn_dim = 2 * c.mlp_hidden_dim();  // the SwiGLU input, the widest per-token tensor
  g.blocks = c.num_layers + c.num_single_layers;
  g.joint = true;
  return g;
}

}  // namespace

const FamilyTraits kFlux2Traits{
    "flux2",                    // name
    true,                       // guided
    false,                      // second_expert
    true,                       // true_cfg (FLUX.2-dev: real CFG beside the embedded scale)
    ExportLayout::Diffusers,    // export_layout
    flux2_schedule,             // schedule
    create_flux2,               // create
    flux2_config_json,          // config_json
    flux2_activation_geometry,  // activation_geometry
};

}  // namespace ditrl::models
