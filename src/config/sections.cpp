#include <ditrl/config/sections.hpp>
#include <ditrl/cuda_build.hpp>

#include <fmt/format.h>

#include <set>

namespace ditrl::config {

void Checker::error(const std::string& key, const std::string& message) const {
  const std::string dotted = section_ + "." + key;
  diag_.error(fmt::format("{}: '{}' {}", sources_.locate(dotted), dotted, message));
}

void RunSection::validate(const Checker& c) const {
  if (out_dir.empty()) c.error("out_dir", "must not be empty");
  if (device == "cuda" && !kCudaBuild)
    c.error("device",
            "= \"cuda\" needs a CUDA build of ditrl (configure with -DDITRL_CUDA=ON); this one runs on the "
            "CPU only (use \"cpu\" or \"auto\")");
}

void ModelSection::validate(const Checker& c) const {
  const models::FamilyTraits* traits = models::find_family_traits(family);
  if (!weights_2.empty() && !(traits && traits->second_expert))
    c.error("weights_2", "is only used by the two-expert Wan2.2 A14B family (family = \"wan\")");
  if (lora.enabled && lora.rank <= 0) c.error("lora.rank", "must be positive when LoRA is enabled");
  if (!lora.weights.empty() && !lora.enabled)
    c.error("lora.weights", "needs model.lora.enabled = true (it is the adapter the run starts from)");
}

void PrecisionSection::validate(const Checker& c) const {
  for (size_t i = 0; i < overrides.size(); ++i)
    if (overrides[i].pattern.empty()) c.error(fmt::format("override[{}].pattern", i), "must not be empty");
  if (master != c10::ScalarType::Float && master != forward)
    c.error("master", "below fp32 must equal the forward dtype (masters are what the optimizer updates)");
  if (!models::runs_on_cpu(attention) && !kCudaBuild)
    c.error("attention",
            fmt::format("= \"{}\" runs on CUDA only and this build of ditrl is CPU-only; use \"math\" or \"flash\"",
                        name_of(models::kAttentionNames, attention)));
}

void RolloutSection::validate(const Checker& c) const {
  if (!window.empty()) {
    if (window.size() != 2 || window[0] >= window[1] || window[1] > steps)
      c.error("window", fmt::format("must be [lo, hi) with 0 <= lo < hi <= steps ({})", steps));
    else if (sde_steps > window[1] - window[0])
      c.error("sde_steps", "must not exceed the window width");
  } else if (sde_steps > steps) {
    c.error("sde_steps", fmt::format("must not exceed steps ({})", steps));
  }
  using diffusion::SdeType;
  using rl::StepStrategy;
  // sde = "ode" samples no SDE step whatever the strategy (a pure-ODE rollout writes an empty SDE set).
  const bool stochastic = sde != SdeType::Ode && strategy != StepStrategy::OdeAndReturnLast;
  if (stochastic && sde_steps < 1)
    c.error("sde_steps", fmt::format("must be >= 1 for strategy \"{}\" with sde = \"{}\" (the SDE steps "
                                     "trained per sample)",
                                     name_of(rl::kStepStrategyNames, strategy), name_of(diffusion::kSdeNames, sde)));
  if (strategy == StepStrategy::EpochGlobalRandomChoice) {
    if (candidate_steps.empty()) c.error("candidate_steps", "is required by strategy \"epoch_global_random_choice\"");
    std::set<int64_t> seen;
    for (int64_t s : candidate_steps) {
      if (s >= steps) c.error("candidate_steps", fmt::format("entry {} is not a step index below {}", s, steps));
      if (!seen.insert(s).second) c.error("candidate_steps", fmt::format("lists step {} twice", s));
    }
  }
  if (stochastic && noise_level <= 0) c.error("noise_level", "must be > 0 for stochastic (sde/cps) sampling");
  if (sde == SdeType::Cps && noise_level > 1)
    c.error("noise_level", fmt::format("= {} must be in (0, 1] for sde = \"cps\" (the noise angle in units of "
                                       "pi/2)",
                                       noise_level));
}

void RewardSection::validate(const Checker& c) const {
  using rollout::RewardKind;
  if (kind == RewardKind::TorchScript && module.empty()) c.error("module", "is required when kind = \"torchscript\"");
  if (kind == RewardKind::Command && command.empty()) c.error("command", "is required when kind = \"command\"");
  if (kind != RewardKind::Http) return;
  if (url.rfind("http://", 0) != 0)
    c.error("url", fmt::format("= \"{}\" must be an http:// URL of a reward server (kind = \"http\")", url));
  if (input == rollout::RewardInput::Images && decoder.empty())
    c.error("decoder", "is required when input = \"images\" (the module that decodes latents to RGB)");
  if (input == rollout::RewardInput::Latents && !decoder.empty())
    c.error("decoder", "is only used with input = \"images\"");
}

void TrainSection::validate(const Checker& c) const {
  if (betas.size() != 2) c.error("betas", "must have exactly two entries [beta1, beta2]");
  if (lr_schedule != "constant" && warmup == 0 && lr_schedule == "warmup")
    c.error("warmup", "must be > 0 for lr_schedule = \"warmup\"");
}

}  // namespace ditrl::config
