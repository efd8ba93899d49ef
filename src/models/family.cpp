#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

const at::Tensor& Cond::at(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it != tensors.end() && it->second.defined()) return it->second;
  std::vector<std::string> present;
  for (const auto& [key, value] : tensors)
    if (value.defined()) present.push_back(key);
  fail("conditioning tensor '{}' is missing (present: {})", name,
       present.empty() ? std::string("none") : fmt::format("{}", fmt::join(present, ", ")));
}

const at::Tensor& Cond::on_host(const std::string& name) const {
  const auto it = host.find(name);
  return it != host.end() ? it->second : at(name);
}

namespace {

// Masks are small ((B, L) per prompt) and decide control flow; the names are
// the reference forwards' argument names ("encoder_hidden_states_mask",
// "video.context_mask").
bool is_mask(const std::string& name) {
  const std::string suffix = "_mask";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Cond Cond::to(c10::Device device) const {
  Cond out;
  for (const auto& [name, tensor] : tensors) {
    out.tensors[name] = tensor.defined() ? tensor.to(device) : tensor;
    // Once per rollout, where the rows enter: a copy if the source is not on the host.
    if (tensor.defined() && is_mask(name)) out.host[name] = on_host(name).to(c10::kCPU);
  }
  return out;
}

Cond Cond::narrow(int64_t begin, int64_t count) const {
  Cond out;
  for (const auto& [name, tensor] : tensors) out.tensors[name] = tensor.narrow(0, begin, count);
  for (const auto& [name, tensor] : host) out.host[name] = tensor.narrow(0, begin, count);
  return out;
}

Cond Cond::index_select(const at::Tensor& index) const {
  Cond out;
  // index_select takes its index on the tensor's device (a GPU tensor refuses a host index). The index
  // is host bookkeeping, picked once per micro-batch: it travels through pinned memory, since a copy
  // from pageable memory would make the host wait for the GPU's queue to drain.
  at::Tensor device_index;  // copied once for the tensors of one device
  for (const auto& [name, tensor] : tensors) {
    if (!device_index.defined() || device_index.device() != tensor.device())
      device_index = dist::host_to_device(index, tensor.device());
    out.tensors[name] = tensor.index_select(0, device_index);
  }
  for (const auto& [name, tensor] : host) out.host[name] = tensor.index_select(0, index.to(at::kCPU));
  return out;
}

Cond Cond::cat(const Cond& first, const Cond& second) {
  Cond out;
  for (const auto& [name, tensor] : first.tensors) out.tensors[name] = at::cat({tensor, second.at(name)}, 0);
  // A host copy only where both halves have one; else on_host reads the joint tensor.
  for (const auto& [name, tensor] : first.host)
    if (second.host.count(name)) out.host[name] = at::cat({tensor, second.host.at(name)}, 0);
  return out;
}

void Family::check_sequence_parallel(int64_t ranks, const LatentGrid& /*grid*/) const {
  if (ranks > 1)
    fail("parallel.sequence_parallel = {}: family '{}' has no sequence-parallel forward yet (wan has); expected 1",
         ranks, family_name());
}

precision::InputPolicy Family::default_input_policy(c10::ScalarType forward) const {
  // Latents and text features in the forward dtype; timesteps as the
  // scheduler made them (fp32), so the sinusoid sees the exact values.
  return precision::InputPolicy{forward, forward, std::nullopt};
}

at::Tensor Family::cfg_combine(const at::Tensor& pos, const at::Tensor& neg, const GuidanceOptions& g,
                               double timestep) const {
  return neg + guidance_scale(g, timestep) * (pos - neg);
}

void require_input_shape(const char* family, const at::Tensor& t, const char* name, const std::vector<int64_t>& shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || t.size(static_cast<int64_t>(i)) == shape[i];
  if (ok) return;
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d < 0 ? "*" : std::to_string(d));
  fail("{}: input '{}' has shape {}, expected [{}]", family, name, c10::str(t.sizes()), fmt::join(dims, ", "));
}

std::shared_ptr<Family> create_family(const FamilyOptions& options) {
  const FamilyTraits* traits = find_family_traits(options.family);
  if (!traits)
    fail("unknown model family '{}': known families are {}", options.family, fmt::join(family_names(), ", "));
  std::shared_ptr<Family> family = traits->create(options);
  if (options.experts > 1 && family->expert_modules().size() != static_cast<size_t>(options.experts))
    fail("model family '{}' does not run {} expert DiTs (two experts are Wan2.2 A14B's)", options.family,
         options.experts);
  // Sliced: the base values come later, slice by slice (models::SeededSource
  // draws the same init); the adapters are small and drawn here as always.
  if (!options.device.is_meta() && !options.sliced) init_parameters(*family, options.init_seed);
  if (options.lora.enabled)
    attach_lora(*family, options.lora, family->default_lora_targets(), options.buffer_options());
  return family;
}

}  // namespace ditrl::models
