// The per-rank peak memory prediction of `ditrl plan`.

#include <ditrl/app/memory_plan.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/precision/names.hpp>
#include <ditrl/rl/algorithm.hpp>
#include <ditrl/rl/step_strategy.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

namespace ditrl::app {

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Whether any step of the deck's schedule runs classifier-free guidance
// (the rollout and the training forward then run positive and negative).
bool deck_uses_cfg(const config::Config& c, const models::Family& family) {
  const models::LatentGrid grid = latent_grid(c);
  const diffusion::Schedule schedule =
      models::family_schedule(c.model.family, {c.rollout.steps, c.rollout.shift, grid.frames, grid.height,
                                                grid.width, c.model.preset, c.model.config});
  const rollout::SamplerOptions sampler = sampler_options(c);
  for (int64_t i = 0; i < schedule.steps(); ++i)
    if (models::uses_cfg(family, sampler.guidance, schedule.timestep(i))) return true;
  return false;
}

// One rank's rollout as the sampler keeps it (rollout/sampler.hpp): x_i for
// the strategy's latents and x_0, the velocity of each SDE step and x_T, all
// fp32, and the samples' conditioning rows (negative ones too with CFG).
int64_t trajectory_bytes(const config::Config& c, const models::Family& family, int64_t samples, bool cfg) {
  const std::vector<int64_t> shape = family.latent_shape(1, latent_grid(c));
  const int64_t latent = numel(shape) * 4;
  const rl::StepSelection steps = rl::select_steps(strategy_options(c), {0, 0});
  std::set<int64_t> kept(steps.return_latents.begin(), steps.return_latents.end());
  kept.insert(0);
  const int64_t per_sample = latent * (static_cast<int64_t>(kept.size() + steps.sde_steps.size()) + 1);
  int64_t cond = 0;
  for (const models::CondSpec& spec : family.cond_spec())
    cond += numel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
  return samples * (per_sample + cond * (cfg ? 2 : 1));
}

// Bytes of one sample's conditioning as stored (fp32 text states, integer
// masks) and of its floating tensors cast to the forward dtype.
std::pair<int64_t, int64_t> conditioning_bytes(const models::Family& family, int64_t element_bytes) {
  int64_t stored = 0, cast = 0;
  for (const models::CondSpec& spec : family.cond_spec()) {
    stored += numel(spec.shape) * static_cast<int64_t>(c10::elementSize(spec.dtype));
    if (c10::isFloatingType(spec.dtype) && static_cast<int64_t>(c10::elementSize(spec.dtype)) != element_bytes)
      cast += numel(spec.shape) * element_bytes;
  }
  return {stored, cast};
}

// The largest unit's parameter gradients (autograd's, in the compute
// dtype) and its gradient-reduce buffers (the padded flat group and this
// rank's part, in the reduce dtype) while its backward runs.
int64_t unit_gradient_bytes(const shard::Layout& layout) {
  int64_t most = 0;
  for (const shard::UnitLayout& unit : layout.units) {
    int64_t bytes = 0;
    for (const shard::FlatGroup& g : unit.groups)
      if (g.trainable)
        bytes += g.numel * precision::dtype_bytes(g.compute) +
                 g.shard * (layout.world_size + 1) * precision::dtype_bytes(g.reduce);
    most = std::max(most, bytes);
  }
  return most;
}

std::string gb(int64_t bytes) {
  return fmt::format("{:.3f} GB", static_cast<double>(bytes) / 1e9);
}

std::string activations_text(const models::ActivationEstimate& e) {
  return fmt::format("{} (block inputs {}, one block {}, attention scores {})", gb(e.total()), gb(e.saved_inputs),
                     gb(e.block), gb(e.attention));
}

}  // namespace

std::shared_ptr<models::Family> plan_family(const config::Config& c) {
  models::FamilyOptions options = family_options(c, c10::kMeta);
  options.sliced = true;
  options.crop_to_grid = true;
  return models::create_family(options);
}

int64_t MemoryPlan::peak() const {
  return std::max({load_peak(), rollout_peak(), training_peak()});
}

MemoryPlan memory_plan(const config::Config& c, const models::Family& family, const shard::Layout& layout) {
  MemoryPlan plan;
  const shard::MemoryReport report = layout.memory(c.parallel.prefetch, c.parallel.reshard_after_forward);
  plan.state = report.masters + report.moments + report.grads + report.compute;
  plan.buffers = models::held_buffer_bytes(family);
  for (const auto& p : family.named_parameters()) {
    if (precision::is_lora_name(p.key()))
      plan.adapters += p.value().numel() * 4;
    else
      plan.load = std::max(plan.load, p.value().numel() * 4);
  }
  if (rl::copies_masters(c.train.loss, c.train.kl_beta, c.model.lora.enabled)) plan.shadows = report.masters;

  plan.gathered = report.peak_gathered;
  if (c.parallel.rollout_keep_gathered) {
    int64_t every_unit = 0;
    for (const shard::UnitLayout& unit : layout.units) every_unit += unit.gathered_bytes(layout.world_size);
    plan.gathered = std::max(plan.gathered, every_unit);
  }
  const int64_t sequence = std::max<int64_t>(c.parallel.sequence_parallel, 1);
  const int64_t groups = std::max<int64_t>(layout.world_size / sequence, 1);
  const int64_t samples = c.rollout.batch * c.rollout.samples_per_prompt / groups;
  const bool cfg = deck_uses_cfg(c, family);
  plan.trajectories = trajectory_bytes(c, family, samples, cfg);
  plan.unit_grads = unit_gradient_bytes(layout);

  const int64_t element_bytes = precision::dtype_bytes(c.precision.forward);
  const auto [stored, cast] = conditioning_bytes(family, element_bytes);
  const int64_t halves = cfg ? 2 : 1;
  const int64_t microgroup = sampler_options(c).microgroup;
  // The rollout's rows are views; CFG concatenates them (a copy), and the
  // family casts what it gets.
  plan.rollout_inputs = microgroup * ((cfg ? 2 * stored : 0) + halves * cast);
  // Training takes its rows with index_select (copies, negative ones too).
  plan.training_inputs = training_micro_batch(c) * (halves * stored + (cfg ? 2 * stored : 0) + halves * cast);

  if (const auto geometry = models::traits_of(family).activation_geometry(family, latent_grid(c))) {
    plan.activations_modelled = true;
    models::ActivationOptions o;
    o.sequence_parallel = sequence;
    o.element_bytes = element_bytes;
    o.math_attention = c.precision.attention == models::AttentionBackend::Math;
    o.batch = sampler_options(c).microgroup * (cfg ? 2 : 1);
    plan.rollout = models::estimate_forward(*geometry, o);
    o.batch = training_micro_batch(c) * (cfg ? 2 : 1);
    o.recompute = c.parallel.recompute;
    plan.training = models::estimate_training(*geometry, o);
  }
  return plan;
}

std::string MemoryPlan::text() const {
  std::string out = "# predicted peak memory per rank (app/memory_plan.hpp; GB = 10^9 B):\n";
  out += fmt::format("#   resident    {}: process {}, parameter state {}, buffers {}, LoRA adapters {}, shadows {}\n",
                     gb(resident()), gb(baseline), gb(state), gb(buffers), gb(adapters), gb(shadows));
  out += fmt::format("#   load        {}: + the largest parameter whole {}\n", gb(load_peak()), gb(load));
  out += fmt::format(
      "#   rollout     {}: + gathered units {}, trajectories {}, conditioning copies {}, forward activations {}\n",
      gb(rollout_peak()), gb(gathered), gb(trajectories), gb(rollout_inputs), activations_text(rollout));
  out += fmt::format(
      "#   training    {}: + gathered units {}, trajectories {}, conditioning copies {}, unit gradients {}, step "
      "activations {}\n",
      gb(training_peak()), gb(gathered), gb(trajectories), gb(training_inputs), gb(unit_grads),
      activations_text(training));
  if (!activations_modelled) out += "#   (no activation model for this family: counted as 0)\n";
  out += fmt::format(
      "# on a GPU, the allocator's predicted peak per rank (all but the process, with cuBLAS workspaces {}): {} ({} "
      "B)\n",
      gb(kCublasWorkspaceBytes), gb(device_peak()), device_peak());
  out += fmt::format("# predicted peak per rank: {} ({} B)\n", gb(peak()), peak());
  return out;
}

}  // namespace ditrl::app
