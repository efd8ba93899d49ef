#include <ditrl/error.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <map>
#include <optional>

namespace ditrl::models {

namespace {

// At most `limit` names, then how many more.
std::string name_list(const std::vector<std::string>& names, size_t limit = 20) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += fmt::format(", ... and {} more", names.size() - limit);
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Canonical name -> checkpoint name, refusing two spellings of one tensor. A
// family maps its checkpoints' own spellings (prefixes) first and may skip
// tensors of the file that are not part of the model; `skipped` counts them.
std::map<std::string, std::string> canonical_names(const torch::nn::Module& model, const io::Checkpoint& checkpoint,
                                                   size_t* skipped = nullptr) {
  const auto* family = dynamic_cast<const Family*>(&model);
  std::map<std::string, std::string> out;  // canonical -> name in the file
  for (const std::string& name : checkpoint.names()) {
    const std::optional<std::string> stored = family ? family->checkpoint_name(name) : name;
    if (!stored) {
      if (skipped) ++*skipped;
      continue;
    }
    const std::string canonical = precision::canonical_name(*stored);
    if (const auto it = out.find(canonical); it != out.end())
      fail("{}: '{}' and '{}' are the same parameter '{}'", checkpoint.path(), it->second, name, canonical);
    out[canonical] = name;
  }
  return out;
}

// Every parameter and buffer by checkpoint name.
std::map<std::string, at::Tensor> named_tensors(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value();
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value();
  return out;
}

// Floating dtypes whose cast to the fp32 parameters is defined (an integer
// or boolean tensor would be converted silently; fp8 and sub-byte codes have
// no conversion here).
bool loadable_dtype(const std::string& code) {
  return code == "F32" || code == "BF16" || code == "F16" || code == "F64";
}

void require_materialized(const torch::nn::Module& model, const std::string& what) {
  for (const auto& p : model.named_parameters())
    if (p.value().is_meta()) fail("cannot {} a model built on the meta device (shapes only): '{}'", what, p.key());
}

struct CheckpointEntry {
  std::string name;
  std::vector<int64_t> shape;
  // Parameters are required; LoRA factors keep their init when absent, and
  // persistent buffers (SD3's pos_embed table) are computed by the model.
  bool required = true;
};

// What a checkpoint of `model` holds, in registration order.
std::vector<CheckpointEntry> checkpoint_layout(const torch::nn::Module& model) {
  std::vector<CheckpointEntry> out;
  for (const auto& p : model.named_parameters())
    out.push_back({p.key(), p.value().sizes().vec(), !precision::is_lora_name(p.key())});
  for (const auto& b : model.named_buffers()) out.push_back({b.key(), b.value().sizes().vec(), false});
  return out;
}

}  // namespace

io::Checkpoint open_checkpoint(const torch::nn::Module& model, const std::string& path) {
  io::Checkpoint checkpoint(path);
  if (const auto* family = dynamic_cast<const Family*>(&model))
    if (const auto table = family->checkpoint_regrouping(checkpoint); !table.empty()) checkpoint.regroup(table);
  return checkpoint;
}

std::map<std::string, std::string> stored_names(const torch::nn::Module& model, const io::Checkpoint& checkpoint) {
  return canonical_names(model, checkpoint);
}

void validate_checkpoint(const torch::nn::Module& model, const io::Checkpoint& checkpoint) {
  size_t skipped = 0;
  const std::map<std::string, std::string> in_file = canonical_names(model, checkpoint, &skipped);
  std::vector<std::string> missing, unexpected, wrong_shape, wrong_dtype;
  std::map<std::string, const CheckpointEntry*> expected;
  const std::vector<CheckpointEntry> layout = checkpoint_layout(model);
  for (const CheckpointEntry& e : layout) {
    expected[e.name] = &e;
    const auto it = in_file.find(e.name);
    if (it == in_file.end()) {
      if (e.required) missing.push_back(e.name);
      continue;
    }
    const io::TensorInfo& stored = checkpoint.info(it->second);
    if (stored.shape != e.shape)
      wrong_shape.push_back(
          fmt::format("{} (checkpoint {}, model {})", it->second, shape_text(stored.shape), shape_text(e.shape)));
    if (!loadable_dtype(stored.dtype)) wrong_dtype.push_back(fmt::format("{} ({})", it->second, stored.dtype));
  }
  for (const auto& [canonical, name] : in_file)
    if (!expected.count(canonical)) unexpected.push_back(name);
  if (missing.empty() && unexpected.empty() && wrong_shape.empty() && wrong_dtype.empty()) return;
  std::string message = fmt::format(
      "checkpoint {} does not match the model ({} tensors in the checkpoint{}, {} in the model):", checkpoint.path(),
      in_file.size(), skipped ? fmt::format(" besides {} that are not part of the model", skipped) : "", layout.size());
  if (!missing.empty()) message += fmt::format("\n  missing ({}): {}", missing.size(), name_list(missing));
  if (!unexpected.empty()) message += fmt::format("\n  unexpected ({}): {}", unexpected.size(), name_list(unexpected));
  if (!wrong_shape.empty())
    message += fmt::format("\n  wrong shape ({}): {}", wrong_shape.size(), name_list(wrong_shape, 10));
  if (!wrong_dtype.empty())
    message += fmt::format("\n  wrong dtype ({}, expected F32, BF16, F16 or F64): {}", wrong_dtype.size(),
                           name_list(wrong_dtype, 10));
  throw Error(message);
}

void load_weights(torch::nn::Module& model, const io::Checkpoint& checkpoint) {
  require_materialized(model, "load weights into");
  validate_checkpoint(model, checkpoint);
  const std::map<std::string, at::Tensor> targets = named_tensors(model);
  torch::NoGradGuard no_grad;
  for (const auto& [canonical, name] : canonical_names(model, checkpoint))
    targets.at(canonical).copy_(checkpoint.view(name));
}

at::Tensor seeded_value(const std::string& name, at::IntArrayRef shape, at::Generator& gen) {
  at::Tensor v = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  v.normal_(0.0, 1.0, gen);
  const bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
  if (v.dim() >= 2)
    v.div_(std::sqrt(static_cast<double>(v.numel() / v.size(0))));
  else if (is_weight)
    v.mul_(0.1).add_(1.0);
  else
    v.mul_(0.1);
  return v;
}

void init_parameters(torch::nn::Module& model, int64_t seed) {
  require_materialized(model, "initialise");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  torch::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters())
    if (!precision::is_lora_name(p.key())) p.value().copy_(seeded_value(p.key(), p.value().sizes(), gen));
}

void cast_parameters(torch::nn::Module& model, c10::ScalarType forward, const std::vector<DtypeOverride>& overrides) {
  const auto cast = [&](const std::string& name, at::Tensor t) {
    if (!t.is_floating_point()) return;
    c10::ScalarType dtype = forward;
    for (const DtypeOverride& rule : overrides)
      if (precision::glob_match(rule.pattern, name)) dtype = rule.dtype;
    if (t.scalar_type() != dtype) t.set_data(t.to(dtype));
  };
  torch::NoGradGuard no_grad;
  for (const auto& p : model.named_parameters()) cast(p.key(), p.value());
  for (const auto& b : model.named_buffers()) cast(b.key(), b.value());
}

io::NamedTensors state_tensors(const torch::nn::Module& model) {
  io::NamedTensors out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

std::optional<NonFinite> find_nonfinite(const std::string& name, const at::Tensor& tensor) {
  if (!at::isFloatingType(tensor.scalar_type()) || tensor.numel() == 0) return std::nullopt;
  const at::Tensor values = tensor.detach();
  if (at::isfinite(values).all().item<bool>()) return std::nullopt;
  NonFinite found;
  found.name = name;
  found.nan = at::isnan(values).sum().item<int64_t>();
  found.inf = at::isinf(values).sum().item<int64_t>();
  found.numel = values.numel();
  return found;
}

std::string describe_nonfinite(const std::vector<NonFinite>& found) {
  std::string text;
  for (size_t i = 0; i < found.size() && i < 10; ++i)
    text += fmt::format("{}{} ({} NaN, {} Inf of {})", i ? ", " : "", found[i].name, found[i].nan, found[i].inf,
                        found[i].numel);
  if (found.size() > 10) text += fmt::format(" and {} more", found.size() - 10);
  return text;
}

}  // namespace ditrl::models
