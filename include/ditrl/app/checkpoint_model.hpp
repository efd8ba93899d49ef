#pragma once

// The model a training checkpoint holds, rebuilt on one process: the family
// its stored deck describes (preset or config, base weights or seeded init,
// both Wan2.2 experts, the deck's LoRA adapters), with the checkpoint's
// trained parameters copied in. A checkpoint written by any number of ranks
// reads the same: every dataset holds the full logical shape. `ditrl export`
// and `ditrl forward --checkpoint` share it.

#include <ditrl/config/deck.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/parameter_source.hpp>

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace ditrl::app {

struct CheckpointModel {
  config::Config config;  // the stored deck
  std::shared_ptr<models::Family> family;
  size_t trained_tensors = 0;
  bool lora = false;
};

CheckpointModel load_checkpoint_model(const std::string& checkpoint,
                                      models::AttentionBackend attention = models::AttentionBackend::Math);

// The same model, never whole in memory: the family built sliced (its base
// on the meta device, app::sliced_deck_model), the source of its base values
// (the deck's weights or seeded init) and the checkpoint's trained
// parameters, which a LoRA run's adapters are copied in from and a full
// fine-tune's are read one at a time. value() gives each tensor as the
// whole model of load_checkpoint_model holds it, so `ditrl export` streams
// the model tensor by tensor.
class StreamedCheckpointModel {
 public:
  explicit StreamedCheckpointModel(const std::string& checkpoint);

  const config::Config& config() const { return config_; }
  models::Family& family() { return *family_; }
  size_t trained_tensors() const { return trained_tensors_; }
  bool lora() const { return config_.model.lora.enabled; }
  // The family's name of a parameter or buffer of `module` (the family or
  // one of its expert modules), by the tensor itself.
  const std::string& family_name(const at::Tensor& tensor) const;
  // Parameter or buffer `name` (the family's name), in its dtype and shape.
  // Base parameters are asked for in the family's registration order (the
  // seeded init draws them in turn); each call reads that one tensor.
  at::Tensor value(const std::string& name);

 private:
  config::Config config_;
  std::shared_ptr<models::Family> family_;
  std::unique_ptr<models::ParameterSource> source_;
  std::unique_ptr<io::TrainedWeights> trained_;
  std::map<std::string, at::Tensor> tensors_;            // the family's parameters and buffers
  std::map<const c10::TensorImpl*, std::string> names_;  // the same, by tensor
  std::map<std::string, std::string> trained_meta_;      // meta parameter -> its dataset name
  size_t trained_tensors_ = 0;
};

}  // namespace ditrl::app
