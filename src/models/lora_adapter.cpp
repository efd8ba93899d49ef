#include <ditrl/error.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/lora_adapter.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <set>

namespace ditrl::models {

namespace {

std::map<std::string, std::shared_ptr<Linear>> linear_layers(const torch::nn::Module& model) {
  std::map<std::string, std::shared_ptr<Linear>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto linear = std::dynamic_pointer_cast<Linear>(item.value())) out[item.key()] = linear;
  return out;
}

// At most `limit` names, then how many more.
std::string some(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += fmt::format(", ... and {} more", names.size() - limit);
  return out;
}

bool same_alpha(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

void copy_factors(Linear& linear, const LoraFactors& f) {
  torch::NoGradGuard no_grad;
  linear.lora_A->weight.copy_(f.a);
  linear.lora_B->weight.copy_(f.b);
}

}  // namespace

std::vector<std::string> LoraAdapter::module_names() const {
  std::vector<std::string> names;
  for (const auto& [name, f] : modules) names.push_back(name);
  return names;
}

LoraAdapter LoraAdapter::under(const std::string& prefix) const {
  LoraAdapter out{rank, alpha, {}};
  for (const auto& [name, f] : modules)
    if (name.rfind(prefix, 0) == 0) out.modules[name.substr(prefix.size())] = f;
  return out;
}

void LoraAdapter::validate(const std::string& source) const {
  if (modules.empty()) fail("{}: the LoRA adapter adapts no module", source);
  if (rank <= 0) fail("{}: LoRA rank must be positive, got {}", source, rank);
  if (!(alpha > 0) || !std::isfinite(alpha)) fail("{}: LoRA alpha must be positive, got {}", source, alpha);
  for (const auto& [name, f] : modules) {
    if (!f.a.defined() || !f.b.defined())
      fail("{}: module {} has {} but not {}", source, name, f.a.defined() ? "lora_A" : "lora_B",
           f.a.defined() ? "lora_B" : "lora_A");
    if (f.a.dim() != 2 || f.b.dim() != 2 || f.a.size(0) != rank || f.b.size(1) != rank)
      fail("{}: module {} has lora_A [{}] and lora_B [{}]; rank {} needs lora_A [{}, in] and lora_B [out, {}]", source,
           name, fmt::join(f.a.sizes(), ", "), fmt::join(f.b.sizes(), ", "), rank, rank, rank);
  }
}

LoraAdapter lora_adapter_of(const torch::nn::Module& model) {
  LoraAdapter out;
  for (const auto& [name, linear] : linear_layers(model)) {
    if (!linear->has_lora()) continue;
    if (out.modules.empty()) {
      out.rank = linear->lora_rank();
      out.alpha = linear->lora_alpha();
    } else if (linear->lora_rank() != out.rank || !same_alpha(linear->lora_alpha(), out.alpha)) {
      fail("LoRA adapters of one model differ in rank or alpha ({}: r={}, alpha={}; others r={}, alpha={})", name,
           linear->lora_rank(), linear->lora_alpha(), out.rank, out.alpha);
    }
    out.modules[name] = {linear->lora_A->weight.detach(), linear->lora_B->weight.detach()};
  }
  if (out.modules.empty()) fail("the model has no LoRA adapter");
  return out;
}

void attach_lora_adapter(torch::nn::Module& model, const LoraAdapter& adapter, const std::string& source) {
  adapter.validate(source);
  const auto layers = linear_layers(model);
  std::vector<std::string> bad;
  for (const auto& [name, f] : adapter.modules) {
    const auto it = layers.find(name);
    if (it == layers.end()) {
      bad.push_back(name + " (not a linear layer of the model)");
    } else if (it->second->has_lora()) {
      bad.push_back(name + " (already has an adapter)");
    } else if (f.a.size(1) != it->second->in_features() || f.b.size(0) != it->second->out_features()) {
      bad.push_back(fmt::format("{} (lora_A [{}], lora_B [{}] for a {} -> {} layer)", name,
                                fmt::join(f.a.sizes(), ", "), fmt::join(f.b.sizes(), ", "), it->second->in_features(),
                                it->second->out_features()));
    }
  }
  if (!bad.empty()) fail("{}: the LoRA adapter does not fit the model: {}", source, some(bad));
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  for (const auto& [name, f] : adapter.modules) {
    Linear& linear = *layers.at(name);
    linear.attach_lora(adapter.rank, adapter.alpha);
    copy_factors(linear, f);
  }
}

void load_lora_adapter(torch::nn::Module& model, const LoraAdapter& adapter, const std::string& source) {
  adapter.validate(source);
  const LoraAdapter mine = lora_adapter_of(model);
  std::vector<std::string> problems;
  if (adapter.rank != mine.rank)
    problems.push_back(fmt::format("rank {} in the file, model.lora.rank = {} in the deck", adapter.rank, mine.rank));
  if (!same_alpha(adapter.alpha, mine.alpha))
    problems.push_back(
        fmt::format("alpha {} in the file, model.lora.alpha = {} in the deck", adapter.alpha, mine.alpha));
  std::vector<std::string> only_file, only_model;
  for (const auto& [name, f] : adapter.modules)
    if (!mine.modules.count(name)) only_file.push_back(name);
  for (const auto& [name, f] : mine.modules)
    if (!adapter.modules.count(name)) only_model.push_back(name);
  if (!only_file.empty())
    problems.push_back(fmt::format("{} adapted module(s) that model.lora.targets does not select: {}", only_file.size(),
                                   some(only_file)));
  if (!only_model.empty())
    problems.push_back(fmt::format("{} module(s) that model.lora.targets selects are not in the file: {}",
                                   only_model.size(), some(only_model)));
  if (problems.empty())
    for (const auto& [name, f] : adapter.modules)
      if (f.a.sizes() != mine.modules.at(name).a.sizes() || f.b.sizes() != mine.modules.at(name).b.sizes())
        problems.push_back(fmt::format("{}: lora_A [{}] / lora_B [{}] in the file, [{}] / [{}] in the model", name,
                                       fmt::join(f.a.sizes(), ", "), fmt::join(f.b.sizes(), ", "),
                                       fmt::join(mine.modules.at(name).a.sizes(), ", "),
                                       fmt::join(mine.modules.at(name).b.sizes(), ", ")));
  if (!problems.empty())
    fail("{}: the LoRA adapter does not match the deck's LoRA: {}", source, fmt::join(problems, "; "));
  const auto layers = linear_layers(model);
  for (const auto& [name, f] : adapter.modules) copy_factors(*layers.at(name), f);
}

}  // namespace ditrl::models
