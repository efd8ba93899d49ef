#include <ditrl/app/checkpoint_model.hpp>
#include <ditrl/app/options.hpp>
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

// A checkpoint holds the trained parameters only; the frozen base comes from
// the files its deck names, which must still be where they were.
void require_file(const std::string& path, const std::string& key, const std::string& what) {
  if (!path.empty() && !std::filesystem::exists(path))
    fail("{}: {} = \"{}\": no such file (the base weights are not stored in a checkpoint)", what, key, path);
}

}  // namespace

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
  base.precision.attention = attention;
  out.family = deck_model(base, c10::kCPU);

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
