#include <ditrl/clock.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/parameter_source.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace ditrl::models {

void ParameterSource::read_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out) {
  const at::Tensor values = read(name, begin, end);
  const auto copy = Clock::now();
  out.copy_(values);
  stats.copy_s += seconds_since(copy);
}

double stage_range_into(const io::Checkpoint& file, const std::string& name, int64_t begin, int64_t end,
                        const at::Tensor& out, size_t chunk_bytes) {
  const c10::ScalarType stored = io::safetensors_scalar_type(file.info(name).dtype, name);
  if (out.dim() != 1 || out.numel() != end - begin)
    fail("{}: tensor '{}' elements [{}, {}) need a 1-D tensor of {} elements, got {}", file.path(), name, begin, end,
         end - begin, c10::str(out.sizes()));
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / c10::elementSize(stored)));
  const bool to_gpu = !out.device().is_cpu();
  const at::TensorOptions host = at::TensorOptions().dtype(stored).pinned_memory(to_gpu);
  at::Tensor buffer;
  double copy_s = 0;
  for (int64_t first = begin; first < end; first += chunk) {
    const int64_t n = std::min(chunk, end - first);
    // A GPU copy still reads the previous block: a fresh one each chunk.
    if (to_gpu || !buffer.defined()) buffer = at::empty({std::min(chunk, end - begin)}, host);
    const at::Tensor part = buffer.narrow(0, 0, n);
    file.read_range_into(name, first, first + n, part);
    const auto copy = Clock::now();
    out.narrow(0, first - begin, n).copy_(stored == at::kDouble ? part.to(at::kFloat) : part, /*non_blocking=*/to_gpu);
    copy_s += seconds_since(copy);
  }
  return copy_s;
}

namespace {

// The model's meta parameters (what a sliced family leaves to a source), by
// name in registration order, with their shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> meta_parameters(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : model.named_parameters())
    if (p.value().is_meta()) out.emplace_back(p.key(), p.value().sizes().vec());
  return out;
}

class SeededSource final : public ParameterSource {
 public:
  SeededSource(const torch::nn::Module& model, int64_t seed)
      : gen_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed))) {
    // The draws follow init_parameters: every non-LoRA parameter in
    // registration order, materialised ones (none in a sliced family's base)
    // included, so that their draws advance the generator as they did.
    for (const auto& p : model.named_parameters()) {
      if (precision::is_lora_name(p.key())) continue;
      draws_.emplace_back(p.key(), p.value().sizes().vec());
      if (p.value().is_meta()) order_.push_back(p.key());
    }
  }

  const std::vector<std::string>& order() const override { return order_; }

  at::Tensor read(const std::string& name, int64_t begin, int64_t end) override {
    while (current_name_ != name) {
      if (next_ == draws_.size())
        fail("seeded init: '{}' was asked for after the parameters that follow it, or is not a parameter", name);
      current_name_ = draws_[next_].first;
      current_ = seeded_value(current_name_, draws_[next_].second, gen_).reshape(-1);
      ++next_;
    }
    return current_.narrow(0, begin, end - begin);
  }

 private:
  at::Generator gen_;
  std::vector<std::pair<std::string, std::vector<int64_t>>> draws_;
  std::vector<std::string> order_;
  size_t next_ = 0;
  std::string current_name_;
  at::Tensor current_;  // the last drawn parameter, flattened
};

// The windowed patch embeddings of `module` (sliced training's cropped
// pos_embed) by the name of the buffer they hold a window of.
std::map<std::string, PatchEmbed*> windowed_buffers(torch::nn::Module& module) {
  std::map<std::string, PatchEmbed*> out;
  for (const auto& m : module.named_modules()) {
    auto* embed = dynamic_cast<PatchEmbed*>(m.value().get());
    if (embed && embed->windowed()) out[m.key().empty() ? "pos_embed" : m.key() + ".pos_embed"] = embed;
  }
  return out;
}

class CheckpointSource final : public ParameterSource {
 public:
  CheckpointSource(torch::nn::Module& model, const std::vector<CheckpointPart>& parts) {
    std::unordered_map<const c10::TensorImpl*, std::string> model_name;
    for (const auto& p : model.named_parameters()) model_name[p.value().unsafeGetTensorImpl()] = p.key();
    for (const auto& b : model.named_buffers()) model_name[b.value().unsafeGetTensorImpl()] = b.key();
    // Validate every part before reading anything.
    for (const CheckpointPart& part : parts) {
      checkpoints_.push_back(std::make_unique<io::Checkpoint>(open_checkpoint(*part.module, part.path)));
      validate_checkpoint(*part.module, *checkpoints_.back());
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::map<std::string, at::Tensor> tensors;
      for (const auto& p : parts[i].module->named_parameters()) tensors[p.key()] = p.value();
      for (const auto& b : parts[i].module->named_buffers()) tensors[b.key()] = b.value();
      const std::map<std::string, PatchEmbed*> windows = windowed_buffers(*parts[i].module);
      for (const auto& [canonical, stored] : stored_names(*parts[i].module, *checkpoints_[i])) {
        if (const auto w = windows.find(canonical); w != windows.end()) {
          // Only the window's rows of the table are read (a bf16 file's
          // values, not the computed ones it was built with).
          const io::Checkpoint& file = *checkpoints_[i];
          w->second->fill_window([&](int64_t begin, int64_t end) {
            const at::Tensor rows = file.read_range(stored, begin, end);
            stats.bytes += rows.nbytes();
            return rows;
          });
          continue;
        }
        at::Tensor& target = tensors.at(canonical);
        if (!target.is_meta()) {
          target.copy_(checkpoints_[i]->view(stored));
          continue;
        }
        const auto it = model_name.find(target.unsafeGetTensorImpl());
        if (it == model_name.end()) fail("checkpoint {}: '{}' is not a parameter of the model", parts[i].path, stored);
        where_[it->second] = {i, stored};
      }
    }
    for (const auto& [name, shape] : meta_parameters(model))
      if (where_.count(name)) order_.push_back(name);
    for (const auto& [name, place] : where_) by_canonical_[precision::canonical_name(name)] = name;
  }

  const std::vector<std::string>& order() const override { return order_; }

  at::Tensor read(const std::string& name, int64_t begin, int64_t end) override {
    const auto& [file, stored_name] = where(name);
    const at::Tensor stored = file.read_range(stored_name, begin, end);
    count(stored.nbytes(), 0);
    // fp64 would round twice on the unsliced path (file -> fp32 parameter ->
    // slice), so it goes through fp32 here too; bf16, fp16 and fp32 convert
    // to fp32 exactly and are cast once, by the caller, into the slice.
    return stored.scalar_type() == at::kDouble ? stored.to(at::kFloat) : stored;
  }

  void read_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out) override {
    const auto& [file, stored_name] = where(name);
    const c10::ScalarType dtype = io::safetensors_scalar_type(file.info(stored_name).dtype, stored_name);
    const size_t bytes = static_cast<size_t>(end - begin) * c10::elementSize(dtype);
    if (out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == dtype) {
      // The file's bytes are the slice's: read straight into it.
      file.read_range_into(stored_name, begin, end, out);
      count(bytes, 0);
      return;
    }
    count(bytes, stage_range_into(file, stored_name, begin, end, out));
  }

  // preads at explicit offsets of files opened once: any thread, any order.
  bool concurrent_reads() const override { return true; }

  at::Tensor map_ranges(const std::vector<Range>& ranges, c10::ScalarType dtype) override {
    const std::string* path = nullptr;
    uint64_t first = 0, next = 0;
    const uint64_t element = c10::elementSize(dtype);
    for (const Range& r : ranges) {
      const auto name = by_canonical_.find(*r.name);
      if (name == by_canonical_.end()) return {};
      const auto& [file, stored] = where(name->second);
      if (io::safetensors_scalar_type(file.info(stored).dtype, stored) != dtype) return {};
      const std::optional<uint64_t> offset = file.file_offset(stored);
      if (!offset) return {};
      const uint64_t at = *offset + static_cast<uint64_t>(r.begin) * element;
      if (!path) {
        path = &file.file_of(stored);
        first = at;
      } else if (file.file_of(stored) != *path || at != next) {
        return {};
      }
      next = at + static_cast<uint64_t>(r.end - r.begin) * element;
    }
    if (!path || next == first || first % element != 0) return {};
    at::Tensor mapped = io::map_private(*path, first, next - first, dtype);
    if (!mapped.defined()) return {};
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    stats.bytes += next - first;
    stats.mapped_bytes += next - first;
    return mapped;
  }

 private:
  std::pair<const io::Checkpoint&, const std::string&> where(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end()) fail("no checkpoint holds parameter '{}'", name);
    return {*checkpoints_[it->second.first], it->second.second};
  }

  void count(size_t bytes, double copy_s) {
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    stats.bytes += bytes;
    stats.copy_s += copy_s;
  }

  std::vector<std::unique_ptr<io::Checkpoint>> checkpoints_;
  std::map<std::string, std::pair<size_t, std::string>> where_;  // parameter -> (checkpoint, stored name)
  std::map<std::string, std::string> by_canonical_;              // canonical name -> parameter
  std::vector<std::string> order_;
  std::mutex stats_mutex_;  // read_into runs on several threads
};

}  // namespace

std::unique_ptr<ParameterSource> seeded_source(const torch::nn::Module& model, int64_t seed) {
  return std::make_unique<SeededSource>(model, seed);
}

std::unique_ptr<ParameterSource> checkpoint_source(torch::nn::Module& model, const std::vector<CheckpointPart>& parts) {
  return std::make_unique<CheckpointSource>(model, parts);
}

}  // namespace ditrl::models
