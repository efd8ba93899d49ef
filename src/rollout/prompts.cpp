#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/rl/stable_hash.hpp>
#include <ditrl/rollout/prompts.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace ditrl::rollout {

namespace {

std::vector<int64_t> with_batch(int64_t batch, const std::vector<int64_t>& shape) {
  std::vector<int64_t> out{batch};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

bool is_mask(const models::CondSpec& spec) {
  return !c10::isFloatingType(spec.dtype);
}

at::Tensor negative_default(const models::CondSpec& spec, int64_t count) {
  const auto options = at::TensorOptions().dtype(spec.dtype);
  return is_mask(spec) ? at::ones(with_batch(count, spec.shape), options)
                       : at::zeros(with_batch(count, spec.shape), options);
}

class DatasetPrompts final : public PromptSource {
 public:
  DatasetPrompts(const std::string& path, std::vector<models::CondSpec> spec)
      : path_(path), spec_(std::move(spec)), file_(io::h5::File::open(path)) {
    if (!file_.exists("/text")) fail("prompt dataset {}: no /text dataset of prompt strings", path);
    texts_ = file_.read_strings("/text");
    size_ = static_cast<int64_t>(texts_.size());
    if (size_ == 0) fail("prompt dataset {}: no prompts", path);
    std::vector<std::string> problems;
    for (const models::CondSpec& s : spec_) {
      const std::string name = "/cond/" + s.name;
      if (!file_.exists(name)) {
        problems.push_back(fmt::format("missing {} ({}, per-prompt shape [{}])", name, precision::dtype_name(s.dtype),
                                       fmt::join(s.shape, ", ")));
        continue;
      }
      io::h5::Dataset d = file_.open_dataset(name);
      const std::vector<hsize_t> dims = d.shape();
      const std::vector<int64_t> want = with_batch(size_, s.shape);
      if (std::vector<int64_t>(dims.begin(), dims.end()) != want || d.dtype() != s.dtype)
        problems.push_back(fmt::format("{} is {} [{}], the family needs {} [{}]", name,
                                       precision::dtype_name(d.dtype()), fmt::join(dims, ", "),
                                       precision::dtype_name(s.dtype), fmt::join(want, ", ")));
      if (file_.exists("/negative/" + s.name)) {
        const at::Tensor neg = file_.open_dataset("/negative/" + s.name).read();
        if (neg.sizes() != at::IntArrayRef(with_batch(1, s.shape)))
          problems.push_back(fmt::format("/negative/{} has shape [{}], expected [{}]", s.name,
                                         fmt::join(neg.sizes(), ", "), fmt::join(with_batch(1, s.shape), ", ")));
        negative_[s.name] = neg.to(s.dtype);
      }
    }
    if (!problems.empty()) fail("prompt dataset {} does not fit the model: {}", path, fmt::join(problems, "; "));
  }

  int64_t size() const override { return size_; }

  models::Cond fetch(const std::vector<int64_t>& indices) const override {
    models::Cond cond;
    for (const models::CondSpec& s : spec_) {
      io::h5::Dataset d = file_.open_dataset("/cond/" + s.name);
      std::vector<at::Tensor> rows;
      for (int64_t i : indices) rows.push_back(d.read_rows(checked(i), 1));
      cond.tensors[s.name] = at::cat(rows, 0);
    }
    return cond;
  }

  models::Cond negative(int64_t count) const override {
    models::Cond cond;
    for (const models::CondSpec& s : spec_) {
      auto it = negative_.find(s.name);
      cond.tensors[s.name] = it == negative_.end() ? negative_default(s, count)
                                                   : it->second.expand(with_batch(count, s.shape)).contiguous();
    }
    return cond;
  }

  std::string text(int64_t index) const override { return texts_.at(static_cast<size_t>(checked(index))); }

 private:
  int64_t checked(int64_t i) const {
    if (i < 0 || i >= size_) fail("prompt dataset {}: prompt index {} outside [0, {})", path_, i, size_);
    return i;
  }

  std::string path_;
  std::vector<models::CondSpec> spec_;
  io::h5::File file_;
  std::vector<std::string> texts_;
  int64_t size_ = 0;
  std::map<std::string, at::Tensor> negative_;
};

class SyntheticPrompts final : public PromptSource {
 public:
  SyntheticPrompts(std::vector<models::CondSpec> spec, int64_t count, int64_t seed)
      : spec_(std::move(spec)), count_(count), seed_(seed) {}

  int64_t size() const override { return count_; }

  models::Cond fetch(const std::vector<int64_t>& indices) const override {
    models::Cond cond;
    for (size_t k = 0; k < spec_.size(); ++k) {
      const models::CondSpec& s = spec_[k];
      std::vector<at::Tensor> rows;
      for (int64_t i : indices) rows.push_back(row(s, k, i));
      cond.tensors[s.name] = at::stack(rows, 0);
    }
    return cond;
  }

  models::Cond negative(int64_t count) const override {
    models::Cond cond;
    for (const models::CondSpec& s : spec_) cond.tensors[s.name] = negative_default(s, count);
    return cond;
  }

  std::string text(int64_t index) const override { return fmt::format("synthetic prompt {}", index); }

 private:
  at::Tensor row(const models::CondSpec& s, size_t tensor, int64_t index) const {
    if (index < 0 || index >= count_) fail("synthetic prompts: index {} outside [0, {})", index, count_);
    if (is_mask(s)) return at::ones(s.shape, at::TensorOptions().dtype(s.dtype));
    at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("synthetic_prompt", seed_, index, tensor));
    return at::randn(s.shape, gen, at::TensorOptions().dtype(at::kFloat)).to(s.dtype);
  }

  std::vector<models::CondSpec> spec_;
  int64_t count_;
  int64_t seed_;
};

}  // namespace

std::unique_ptr<PromptSource> open_prompt_dataset(const std::string& path, const std::vector<models::CondSpec>& spec) {
  return std::make_unique<DatasetPrompts>(path, spec);
}

std::unique_ptr<PromptSource> synthetic_prompts(const std::vector<models::CondSpec>& spec, int64_t count,
                                                int64_t seed) {
  if (count <= 0) fail("synthetic prompts: count must be positive, got {}", count);
  return std::make_unique<SyntheticPrompts>(spec, count, seed);
}

void write_prompt_dataset(const std::string& path, const std::vector<std::string>& texts, const models::Cond& cond,
                          const models::Cond& negative, const std::map<std::string, std::string>& attributes) {
  io::h5::File file = io::h5::File::create(path);
  file.write_strings("text", texts);
  for (const auto& [name, tensor] : cond.tensors) {
    if (tensor.size(0) != static_cast<int64_t>(texts.size()))
      fail("prompt dataset {}: cond '{}' has {} rows for {} prompts", path, name, tensor.size(0), texts.size());
    std::vector<hsize_t> dims(tensor.sizes().begin(), tensor.sizes().end());
    file.create_dataset("cond/" + name, tensor.scalar_type(), dims).write(tensor.contiguous());
  }
  for (const auto& [name, tensor] : negative.tensors) {
    std::vector<hsize_t> dims(tensor.sizes().begin(), tensor.sizes().end());
    file.create_dataset("negative/" + name, tensor.scalar_type(), dims).write(tensor.contiguous());
  }
  for (const auto& [key, value] : attributes) file.set_attr(key, value);
}

std::vector<int64_t> rollout_prompts(int64_t dataset_size, int64_t seed, int64_t rollout_id, int64_t batch) {
  std::vector<int64_t> out;
  int64_t cached_epoch = -1;
  at::Tensor order;
  for (int64_t j = 0; j < batch; ++j) {
    const int64_t position = rollout_id * batch + j;
    const int64_t epoch = position / dataset_size;
    if (epoch != cached_epoch) {
      at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("prompt_order", seed, epoch));
      order = at::randperm(dataset_size, gen, at::TensorOptions().dtype(at::kLong));
      cached_epoch = epoch;
    }
    out.push_back(order[position % dataset_size].item<int64_t>());
  }
  return out;
}

}  // namespace ditrl::rollout
