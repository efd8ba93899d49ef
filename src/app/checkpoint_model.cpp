#include <ditrl/app/checkpoint_model.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>

namespace ditrl::app {

namespace {

models::FamilyOptions deck_family_options(const config::Config& c, const std::string& attention) {
  models::FamilyOptions o;
  o.family = c.model.family;
  o.preset = c.model.preset;
  o.config_json = c.model.config;
  o.experts = c.model.weights_2.empty() ? 0 : 2;
  o.init_seed = c.model.init_seed;
  o.attention = attention;
  o.lora.enabled = c.model.lora.enabled;
  o.lora.rank = c.model.lora.rank;
  o.lora.alpha = c.model.lora.alpha;
  o.lora.targets = c.model.lora.targets;
  o.lora.init = c.model.lora.init;
  o.lora.seed = c.model.init_seed;
  o.latent_grid = {c.rollout.frames, c.rollout.height, c.rollout.width, c.rollout.fps};
  return o;
}

// A checkpoint holds the trained parameters only; the frozen base comes from
// the files its deck names, which must still be where they were.
void require_file(const std::string& path, const std::string& key, const std::string& what) {
  if (!path.empty() && !std::filesystem::exists(path))
    fail("{}: {} = \"{}\": no such file (the base weights are not stored in a checkpoint)", what, key, path);
}

}  // namespace

void load_deck_weights(models::Family& family, const config::Config& c) {
  if (c.model.weights_2.empty()) {
    if (!c.model.weights.empty()) models::load_weights(family, io::Checkpoint(c.model.weights));
    return;
  }
  if (c.model.weights.empty())
    fail("{}: model.weights_2 (the low-noise expert) needs model.weights (the high-noise expert)", c.source);
  const std::vector<std::shared_ptr<torch::nn::Module>> experts = family.expert_modules();
  if (experts.size() != 2)
    fail("{}: model.weights_2 needs a family with two experts; {} has {}", c.source, family.family_name(),
         experts.size());
  models::load_weights(*experts[0], io::Checkpoint(c.model.weights));
  models::load_weights(*experts[1], io::Checkpoint(c.model.weights_2));
}

std::shared_ptr<models::Family> build_deck_model(const config::Config& c, const std::string& attention) {
  std::shared_ptr<models::Family> family = models::create_family(deck_family_options(c, attention));
  load_deck_weights(*family, c);
  if (!c.model.lora.weights.empty())
    models::load_lora_adapter(*family, models::read_lora_file(c.model.lora.weights), c.model.lora.weights);
  return family;
}

CheckpointModel load_checkpoint_model(const std::string& checkpoint, const std::string& attention) {
  if (!std::filesystem::exists(checkpoint)) fail("checkpoint {}: no such file", checkpoint);
  CheckpointModel out;
  const std::string deck_text = io::h5::File::open(checkpoint).string_attr("deck");
  out.config = config::parse_deck(deck_text, checkpoint + " (stored deck)");
  const config::Config& c = out.config;
  const std::string what = "checkpoint " + checkpoint + " (stored deck)";
  require_file(c.model.weights, "model.weights", what);
  require_file(c.model.weights_2, "model.weights_2", what);
  out.lora = c.model.lora.enabled;
  // The trained adapters replace whatever model.lora.weights held at the start.
  config::Config base = c;
  base.model.lora.weights.clear();
  out.family = build_deck_model(base, attention);

  const std::map<std::string, at::Tensor> trained = io::read_checkpoint_weights(checkpoint);
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> params;
  for (auto& item : out.family->named_parameters()) params[item.key()] = item.value();
  for (const auto& [name, value] : trained) {
    const auto it = params.find(precision::canonical_name(name));
    if (it == params.end())
      fail("{}: trained parameter '{}' is not in the {} model the stored deck builds", checkpoint, name,
           c.model.family);
    if (it->second.numel() != value.numel())
      fail("{}: trained parameter '{}' has {} elements, the model's has {}", checkpoint, name, value.numel(),
           it->second.numel());
    it->second.copy_(value.view(it->second.sizes()));
  }
  out.trained_tensors = trained.size();
  return out;
}

}  // namespace ditrl::app
