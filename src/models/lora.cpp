#include <ditrl/error.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <map>
#include <set>

namespace ditrl::models {

namespace {

// Draws A: "gaussian" N(0, 1/r) (PEFT), "kaiming" U(-1/sqrt(in), 1/sqrt(in))
// (kaiming_uniform with a = sqrt(5), PEFT's default init).
void init_lora_a(at::Tensor& a, const std::string& init, at::Generator& gen) {
  if (a.is_meta()) return;
  at::Tensor v = at::empty(a.sizes(), at::TensorOptions().dtype(at::kFloat));
  if (init == "gaussian") {
    v.normal_(0.0, 1.0 / static_cast<double>(a.size(0)), gen);
  } else {
    const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
    v.uniform_(-bound, bound, gen);
  }
  torch::NoGradGuard no_grad;
  a.copy_(v);
}

}  // namespace

bool lora_target_matches(const std::string& target, const std::string& module) {
  return precision::glob_match(target, module) || precision::glob_match("*." + target, module);
}

std::vector<std::string> attach_lora(torch::nn::Module& model, const LoraOptions& options,
                                     const std::vector<std::string>& default_targets,
                                     const std::optional<at::TensorOptions>& adapter_options) {
  if (options.rank <= 0) fail("LoRA rank must be positive, got {}", options.rank);
  if (!(options.alpha > 0)) fail("LoRA alpha must be positive, got {}", options.alpha);
  if (options.init != "gaussian" && options.init != "kaiming")
    fail("unknown LoRA init '{}': expected gaussian or kaiming", options.init);
  const std::vector<std::string>& targets = options.targets.empty() ? default_targets : options.targets;
  if (targets.empty()) fail("LoRA is enabled but no targets are given and the family has no default targets");
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(options.seed));
  std::vector<std::string> adapted;
  std::set<std::string> used;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto linear = std::dynamic_pointer_cast<Linear>(item.value());
    if (!linear) continue;
    bool selected = false;
    for (const std::string& t : targets)
      if (lora_target_matches(t, item.key())) {
        used.insert(t);
        selected = true;
      }
    if (!selected) continue;
    linear->attach_lora(options.rank, options.alpha, adapter_options.value_or(linear->weight.options()));
    init_lora_a(linear->lora_A->weight, options.init, gen);
    adapted.push_back(item.key());
  }
  for (const std::string& t : targets)
    if (!used.count(t)) fail("LoRA target '{}' matches no linear layer of the model", t);
  return adapted;
}

io::NamedTensors lora_state(const torch::nn::Module& model, bool peft_names) {
  io::NamedTensors out;
  for (const auto& p : model.named_parameters())
    if (precision::is_lora_name(p.key()))
      out.emplace_back(peft_names ? precision::peft_name(p.key()) : p.key(), p.value().detach());
  return out;
}

void load_lora(torch::nn::Module& model, const io::Checkpoint& checkpoint) {
  std::map<std::string, at::Tensor> adapters;
  for (const auto& p : model.named_parameters())
    if (precision::is_lora_name(p.key())) adapters[p.key()] = p.value();
  std::vector<std::string> bad;
  std::map<std::string, std::string> sources;  // canonical -> name in the file
  for (const std::string& name : checkpoint.names()) {
    const std::string canonical = precision::canonical_name(name);
    const auto it = adapters.find(canonical);
    if (it == adapters.end()) {
      bad.push_back(fmt::format("{} (not a LoRA adapter of the model)", name));
    } else if (checkpoint.info(name).shape != it->second.sizes().vec()) {
      bad.push_back(fmt::format("{} (shape [{}], adapter [{}])", name, fmt::join(checkpoint.info(name).shape, ", "),
                                fmt::join(it->second.sizes(), ", ")));
    } else {
      sources[canonical] = name;
    }
  }
  if (!bad.empty())
    fail("LoRA checkpoint {} does not fit the model's adapters: {}", checkpoint.path(), fmt::join(bad, "; "));
  torch::NoGradGuard no_grad;
  for (const auto& [canonical, name] : sources) adapters.at(canonical).copy_(checkpoint.view(name));
}

io::NamedTensors merged_state(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> merged;
  for (const auto& item : model.named_modules("", false))
    if (auto linear = std::dynamic_pointer_cast<Linear>(item.value()); linear && linear->has_lora())
      merged[item.key() + ".weight"] = linear->merged_weight();
  io::NamedTensors out;
  for (const auto& p : model.named_parameters()) {
    if (precision::is_lora_name(p.key())) continue;
    const auto it = merged.find(p.key());
    out.emplace_back(p.key(), it != merged.end() ? it->second : p.value().detach());
  }
  for (const auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

}  // namespace ditrl::models
