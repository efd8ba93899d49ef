#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/reference.hpp>

#include <torch/csrc/autograd/grad_mode.h>
#include <boost/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace ditrl::models {

namespace json = boost::json;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::set<std::string> listed_inputs(const io::SafetensorsFile& file) {
  std::set<std::string> names;
  const auto it = file.metadata().find("input_names");
  if (it == file.metadata().end()) {
    for (const std::string& name : file.names())
      if (!starts_with(name, "output") && !starts_with(name, "intermediate.")) names.insert(name);
    return names;
  }
  json::error_code ec;
  const json::value list = json::parse(it->second, ec);
  if (ec || !list.is_array()) fail("{}: metadata input_names must be a JSON list of tensor names", file.path());
  for (const json::value& v : list.get_array()) {
    if (!v.is_string()) fail("{}: metadata input_names must be a JSON list of tensor names", file.path());
    const std::string name(v.get_string());
    if (!file.contains(name)) fail("{}: input '{}' is listed in input_names but not stored", file.path(), name);
    names.insert(name);
  }
  return names;
}

// The sidecar's "extra" object, else the file's "extra" metadata, else {}.
std::string extra_arguments(const io::SafetensorsFile& file) {
  const std::filesystem::path sidecar = std::filesystem::path(file.path()).replace_extension(".json");
  if (std::filesystem::is_regular_file(sidecar)) {
    std::ifstream in(sidecar);
    std::ostringstream text;
    text << in.rdbuf();
    json::error_code ec;
    const json::value doc = json::parse(text.str(), ec);
    if (ec || !doc.is_object()) fail("sidecar {} is not a JSON object", sidecar.string());
    const json::value* extra = doc.get_object().if_contains("extra");
    return extra && !extra->is_null() ? json::serialize(*extra) : "{}";
  }
  const auto it = file.metadata().find("extra");
  return it != file.metadata().end() ? it->second : "{}";
}

// Names tap records the way the fixtures name forward-hook outputs.
class CollectingTap : public Tap {
 public:
  void record(const std::string& module, const std::string& name, const at::Tensor& value) override {
    const int calls = seen_[module + "\n" + name]++;
    const std::string key = calls == 0 ? fmt::format("intermediate.{}.{}", module, name)
                                       : fmt::format("intermediate.{}.call{}.{}", module, calls, name);
    tensors[key] = value.detach().clone();
  }
  std::map<std::string, at::Tensor> tensors;

 private:
  std::map<std::string, int> seen_;
};

}  // namespace

ReferenceCase load_reference_case(const std::string& path) {
  const io::SafetensorsFile file(path);
  ReferenceCase out;
  out.path = path;
  const std::set<std::string> inputs = listed_inputs(file);
  for (const std::string& name : file.names()) (inputs.count(name) ? out.inputs : out.stored)[name] = file.get(name);
  out.extra_json = extra_arguments(file);
  return out;
}

std::map<std::string, at::Tensor> run_reference_case(Family& family, const ReferenceCase& reference_case,
                                                     bool intermediates) {
  torch::NoGradGuard no_grad;
  CollectingTap tap;
  ForwardContext ctx;
  if (intermediates) ctx.tap = &tap;
  std::map<std::string, at::Tensor> out;
  try {
    out = family.reference_forward(reference_case.inputs, reference_case.extra_json, ctx);
  } catch (const Error& e) {
    fail("{}: {}", reference_case.path, e.what());
  }
  // A case that stores intermediates gets those; the other record points
  // (parity dumps record more than the fixtures keep) only without any.
  const bool stores_intermediates =
      std::any_of(reference_case.stored.begin(), reference_case.stored.end(),
                  [](const auto& item) { return starts_with(item.first, "intermediate."); });
  for (const auto& [name, tensor] : tap.tensors)
    if (!stores_intermediates || reference_case.stored.count(name)) out.emplace(name, tensor);
  return out;
}

}  // namespace ditrl::models
