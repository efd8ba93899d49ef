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
#include <map>

namespace ditrl::app {

namespace {

// A checkpoint holds the trained parameters only; the frozen base comes from
// the files its deck names, which must still be where they were.
void require_file(const std::string& path, const std::string& key, const std::string& what) {
  if (!path.empty() && !std::filesystem::exists(path))
    fail("{}: {} = \"{}\": no such file (the base weights are not stored in a checkpoint)", what, key, path);
}

// The stored deck, with the base weights it names still where they were.
config::Config stored_deck(const std::string& checkpoint) {
  if (!std::filesystem::exists(checkpoint)) fail("checkpoint {}: no such file", checkpoint);
  const std::string deck_text = io::h5::File::open(checkpoint).string_attr("deck");
  config::Config c = config::parse_deck(deck_text, checkpoint + " (stored deck)");
  const std::string what = "checkpoint " + checkpoint + " (stored deck)";
  require_file(c.model.weights, "model.weights", what);
  require_file(c.model.weights_2, "model.weights_2", what);
  return c;
}

// The model the deck starts from: the trained adapters replace whatever
// model.lora.weights held at the start.
config::Config base_deck(const config::Config& c, models::AttentionBackend attention) {
  config::Config base = c;
  base.model.lora.weights.clear();
  base.precision.attention = attention;
  return base;
}

// The family's parameter a trained tensor belongs to; errors name the file.
at::Tensor& trained_target(std::map<std::string, at::Tensor>& params, const std::string& name, int64_t numel,
                           const std::string& checkpoint, const std::string& family) {
  const auto it = params.find(precision::canonical_name(name));
  if (it == params.end())
    fail("{}: trained parameter '{}' is not in the {} model the stored deck builds", checkpoint, name, family);
  if (it->second.numel() != numel)
    fail("{}: trained parameter '{}' has {} elements, the model's has {}", checkpoint, name, numel, it->second.numel());
  return it->second;
}

}  // namespace

CheckpointModel load_checkpoint_model(const std::string& checkpoint, models::AttentionBackend attention) {
  CheckpointModel out;
  out.config = stored_deck(checkpoint);
  out.lora = out.config.model.lora.enabled;
  out.family = deck_model(base_deck(out.config, attention), c10::kCPU);

  const std::map<std::string, at::Tensor> trained = io::read_checkpoint_weights(checkpoint);
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> params;
  for (auto& item : out.family->named_parameters()) params[item.key()] = item.value();
  for (const auto& [name, value] : trained) {
    at::Tensor& target = trained_target(params, name, value.numel(), checkpoint, out.config.model.family);
    target.copy_(value.view(target.sizes()));
  }
  out.trained_tensors = trained.size();
  return out;
}

StreamedCheckpointModel::StreamedCheckpointModel(const std::string& checkpoint) : config_(stored_deck(checkpoint)) {
  SlicedModel sliced = sliced_deck_model(base_deck(config_, models::AttentionBackend::Math), c10::kCPU);
  family_ = std::move(sliced.family);
  source_ = std::move(sliced.source);
  trained_ = std::make_unique<io::TrainedWeights>(checkpoint);
  std::map<std::string, at::Tensor> params;
  for (auto& item : family_->named_parameters()) params[item.key()] = item.value();
  tensors_ = params;
  for (auto& item : family_->named_buffers()) tensors_[item.key()] = item.value();
  for (const auto& [name, tensor] : tensors_) names_[tensor.unsafeGetTensorImpl()] = name;
  torch::NoGradGuard no_grad;
  for (const std::string& name : trained_->names()) {
    const at::Tensor value = trained_->read(name);
    at::Tensor& target = trained_target(params, name, value.numel(), checkpoint, config_.model.family);
    if (target.is_meta())
      trained_meta_[precision::canonical_name(name)] = name;  // a full fine-tune's: read when exported
    else
      target.copy_(value.view(target.sizes()));  // the adapters (small) are copied in now
  }
  trained_tensors_ = trained_->names().size();
}

const std::string& StreamedCheckpointModel::family_name(const at::Tensor& tensor) const {
  const auto it = names_.find(tensor.unsafeGetTensorImpl());
  if (it == names_.end()) fail("export: a tensor of the model is neither a parameter nor a buffer of the family");
  return it->second;
}

at::Tensor StreamedCheckpointModel::value(const std::string& name) {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("export: '{}' is not a parameter or buffer of the model", name);
  const at::Tensor& t = it->second;
  if (!t.is_meta()) return t.detach();
  const auto trained = trained_meta_.find(name);
  const at::Tensor flat =
      trained != trained_meta_.end() ? trained_->read(trained->second).reshape(-1) : source_->read(name, 0, t.numel());
  return flat.to(t.scalar_type()).view(t.sizes());
}

}  // namespace ditrl::app
