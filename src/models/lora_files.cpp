#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/text_file.hpp>
#include <ditrl/models/flux/bfl_checkpoint.hpp>
#include <ditrl/models/lora_files.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <boost/json.hpp>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <optional>
#include <type_traits>
#include <utility>

namespace ditrl::models {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

constexpr const char* kPeftConfig = "adapter_config.json";
constexpr const char* kPeftWeights = "adapter_model.safetensors";
constexpr const char* kDiffusersWeights = "pytorch_lora_weights.safetensors";
constexpr const char* kDiffusersMetadata = "lora_adapter_metadata";  // diffusers' LORA_ADAPTER_METADATA_KEY
constexpr const char* kDiffusersPrefix = "transformer.";
constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kLtxPrefix = "diffusion_model.";      // also ComfyUI's for Wan, Qwen-Image and FLUX.2
constexpr const char* kBflLayoutKey = "ditrl_lora_layout";  // FLUX.2's ComfyUI file: BFL's fused modules

// Wan's checkpoint names (ComfyUI's Wan model, Wan's own code) of ditrl's
// diffusers-named Wan linear layers: inside `blocks.N.`, then the others.
// ditrl's Wan is text-to-video: no k_img/v_img or img_emb layers.
constexpr std::pair<const char*, const char*> kWanBlockNames[] = {
    {"attn1.to_q", "self_attn.q"},  {"attn1.to_k", "self_attn.k"},
    {"attn1.to_v", "self_attn.v"},  {"attn1.to_out.0", "self_attn.o"},
    {"attn2.to_q", "cross_attn.q"}, {"attn2.to_k", "cross_attn.k"},
    {"attn2.to_v", "cross_attn.v"}, {"attn2.to_out.0", "cross_attn.o"},
    {"ffn.net.0.proj", "ffn.0"},    {"ffn.net.2", "ffn.2"}};
constexpr std::pair<const char*, const char*> kWanNames[] = {
    {"condition_embedder.time_embedder.linear_1", "time_embedding.0"},
    {"condition_embedder.time_embedder.linear_2", "time_embedding.2"},
    {"condition_embedder.time_proj", "time_projection.1"},
    {"condition_embedder.text_embedder.linear_1", "text_embedding.0"},
    {"condition_embedder.text_embedder.linear_2", "text_embedding.2"},
    {"proj_out", "head.head"}};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `name` in Wan's checkpoint names (to_wan) or back in ditrl's; nullopt when
// the table has no such layer.
std::optional<std::string> wan_rename(const std::string& name, bool to_wan) {
  auto look = [to_wan](const auto& table, const std::string& key) -> std::optional<std::string> {
    for (const auto& [ours, wan] : table)
      if (key == (to_wan ? ours : wan)) return std::string(to_wan ? wan : ours);
    return std::nullopt;
  };
  const std::string blocks = "blocks.";
  if (name.rfind(blocks, 0) != 0) return look(kWanNames, name);
  size_t end = blocks.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == blocks.size() || end == name.size() || name[end] != '.') return std::nullopt;
  const auto inner = look(kWanBlockNames, name.substr(end + 1));
  if (!inner) return std::nullopt;
  return name.substr(0, end + 1) + *inner;
}

// alpha as JSON: an integer when it is one (PEFT types lora_alpha as int).
json::value alpha_value(double alpha) {
  if (alpha == std::floor(alpha) && std::abs(alpha) < 9.0e15) return json::value(static_cast<int64_t>(alpha));
  return json::value(alpha);
}

// The LoraConfig fields ditrl's adapters have: plain LoRA, one rank and
// alpha, no dropout at inference, no bias, PEFT's default init.
json::object lora_config(const LoraAdapter& adapter) {
  json::array targets;
  for (const std::string& name : adapter.module_names()) targets.emplace_back(name);
  json::object c;
  c["r"] = adapter.rank;
  c["lora_alpha"] = alpha_value(adapter.alpha);
  c["target_modules"] = std::move(targets);
  c["lora_dropout"] = 0.0;
  c["bias"] = "none";
  c["use_rslora"] = false;
  c["use_dora"] = false;
  c["fan_in_fan_out"] = false;
  c["init_lora_weights"] = true;
  return c;
}

at::Tensor stored(const at::Tensor& t, c10::ScalarType dtype) {
  return t.detach().to(at::kCPU).to(dtype).contiguous();
}

io::NamedTensors factor_tensors(const LoraAdapter& adapter, const std::string& prefix, c10::ScalarType dtype,
                                double b_scale = 1.0) {
  io::NamedTensors out;
  for (const auto& [name, f] : adapter.modules) {
    out.emplace_back(prefix + name + ".lora_A.weight", stored(f.a, dtype));
    const at::Tensor b = b_scale == 1.0 ? f.b : f.b.detach().to(at::kFloat) * b_scale;
    out.emplace_back(prefix + name + ".lora_B.weight", stored(b, dtype));
  }
  return out;
}

// A file whose lora_B holds (alpha/r) B (LTX-2's, FLUX.2's ComfyUI file):
// read_safetensors gets the trained factors back from these entries.
void note_b_scaled(const LoraAdapter& adapter, std::map<std::string, std::string>& metadata) {
  metadata["ditrl_lora_rank"] = std::to_string(adapter.rank);
  metadata["ditrl_lora_alpha"] = fmt::format("{}", adapter.alpha);
  metadata["ditrl_lora_b_scaled"] = "alpha/r";
}

// ------------------------------------------------------------------ reading

// What the keys and metadata of one file say before the factors are paired.
struct RawAdapter {
  std::map<std::string, LoraFactors> modules;
  std::map<std::string, double> alphas;  // kohya-style `<module>.alpha` scalars
};

// Which known prefix the file's keys carry ("" = none); one for all keys.
std::string common_prefix(const io::SafetensorsFile& file) {
  std::optional<std::string> found;
  for (const std::string& key : file.names()) {
    std::string prefix;
    for (const char* p : {kPeftPrefix, kDiffusersPrefix, kLtxPrefix})
      if (key.rfind(p, 0) == 0) prefix = p;
    if (found && *found != prefix)
      fail(
          "{}: keys mix the prefixes '{}' and '{}' (one adapter per file: PEFT base_model.model., diffusers "
          "transformer., LTX-2 diffusion_model.)",
          file.path(), *found, prefix);
    found = prefix;
  }
  return found.value_or("");
}

RawAdapter raw_factors(const io::SafetensorsFile& file) {
  RawAdapter raw;
  const std::string prefix = common_prefix(file);
  for (const std::string& key : file.names()) {
    const std::string name = key.substr(prefix.size());
    auto module_of = [&](const std::string& suffix) { return name.substr(0, name.size() - suffix.size()); };
    if (ends_with(name, ".lora_A.weight")) {
      raw.modules[module_of(".lora_A.weight")].a = file.get(key).to(at::kFloat);
    } else if (ends_with(name, ".lora_B.weight")) {
      raw.modules[module_of(".lora_B.weight")].b = file.get(key).to(at::kFloat);
    } else if (ends_with(name, ".lora_A.default.weight")) {
      raw.modules[module_of(".lora_A.default.weight")].a = file.get(key).to(at::kFloat);
    } else if (ends_with(name, ".lora_B.default.weight")) {
      raw.modules[module_of(".lora_B.default.weight")].b = file.get(key).to(at::kFloat);
    } else if (ends_with(name, ".alpha")) {
      const at::Tensor a = file.get(key);
      if (a.numel() != 1) fail("{}: {} holds {} values, expected one alpha", file.path(), key, a.numel());
      raw.alphas[module_of(".alpha")] = a.to(at::kDouble).item<double>();
    } else if (key.find("lora_down") != std::string::npos || key.find("lora_up") != std::string::npos) {
      fail("{}: {} is in kohya's lora_down/lora_up naming; convert it to PEFT or diffusers names (lora_A/lora_B)",
           file.path(), key);
    } else if (key.find("lora_magnitude_vector") != std::string::npos || key.find("dora_scale") != std::string::npos) {
      fail("{}: {} is a DoRA magnitude; DoRA adapters are not supported", file.path(), key);
    } else if (ends_with(name, ".lora_B.bias")) {
      fail("{}: {} is a bias on lora_B (lora_bias); such adapters are not supported", file.path(), key);
    } else {
      fail("{}: {} is not a LoRA factor (expected <module>.lora_A.weight, <module>.lora_B.weight or <module>.alpha)",
           file.path(), key);
    }
  }
  for (const auto& [name, alpha] : raw.alphas)
    if (!raw.modules.count(name)) fail("{}: {}.alpha has no lora_A/lora_B beside it", file.path(), name);
  // ComfyUI's Wan files name the layers as Wan's checkpoint does.
  if (prefix == kLtxPrefix) {
    auto renamed = [](auto& by_name) {
      std::decay_t<decltype(by_name)> out;
      for (auto& [name, value] : by_name) out[wan_rename(name, false).value_or(name)] = std::move(value);
      by_name = std::move(out);
    };
    renamed(raw.modules);
    renamed(raw.alphas);
  }
  if (raw.modules.empty()) fail("{}: no LoRA factors (no key ends with .lora_A.weight)", file.path());
  return raw;
}

int64_t uniform_rank(const RawAdapter& raw, const std::string& path) {
  std::optional<int64_t> rank;
  for (const auto& [name, f] : raw.modules) {
    if (!f.a.defined() || f.a.dim() != 2) fail("{}: module {} has no 2-D lora_A", path, name);
    if (rank && *rank != f.a.size(0))
      fail("{}: module {} has rank {}, others rank {}; per-module ranks (rank_pattern) are not supported", path, name,
           f.a.size(0), *rank);
    rank = f.a.size(0);
  }
  return *rank;
}

const json::value* field(const json::object& o, const std::string& key) {
  const auto it = o.find(key);
  return it == o.end() || it->value().is_null() ? nullptr : &it->value();
}

double number(const json::value& v, const std::string& key, const std::string& source) {
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  if (v.is_double()) return v.as_double();
  fail("{}: {} must be a number, got {}", source, key, json::serialize(v));
}

// r and the effective alpha (rsLoRA's alpha/sqrt(r) scale expressed as an
// alpha over r) of a LoraConfig, refusing the variants ditrl cannot run.
double config_alpha(const json::object& c, int64_t rank, const std::string& source) {
  auto flag = [&](const char* key) {
    const json::value* v = field(c, key);
    return v && v->is_bool() && v->as_bool();
  };
  if (const json::value* t = field(c, "peft_type"); t && !(t->is_string() && t->as_string() == "LORA"))
    fail("{}: peft_type is {}, only LORA adapters are supported", source, json::serialize(*t));
  if (flag("use_dora")) fail("{}: use_dora = true: DoRA adapters are not supported", source);
  if (flag("fan_in_fan_out")) fail("{}: fan_in_fan_out = true (Conv1D layers) is not supported", source);
  if (flag("lora_bias")) fail("{}: lora_bias = true is not supported", source);
  if (const json::value* b = field(c, "bias"); b && !(b->is_string() && b->as_string() == "none"))
    fail("{}: bias = {}: only bias = \"none\" is supported", source, json::serialize(*b));
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (const json::value* p = field(c, key); p && p->is_object() && !p->as_object().empty())
      fail("{}: {} is set; per-module ranks or alphas are not supported", source, key);
  const json::value* r = field(c, "r");
  if (r && static_cast<int64_t>(number(*r, "r", source)) != rank)
    fail("{}: r = {} but the factors have rank {}", source, json::serialize(*r), rank);
  const json::value* a = field(c, "lora_alpha");
  const double alpha = a ? number(*a, "lora_alpha", source) : static_cast<double>(rank);
  return flag("use_rslora") ? alpha * std::sqrt(static_cast<double>(rank)) : alpha;
}

json::object parse_object(const std::string& text, const std::string& source) {
  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) fail("{}: not a JSON object{}", source, ec ? ": " + ec.message() : "");
  return v.as_object();
}

// The diffusers metadata, prefix `transformer.` removed.
std::optional<json::object> diffusers_config(const io::SafetensorsFile& file) {
  const auto it = file.metadata().find(kDiffusersMetadata);
  if (it == file.metadata().end()) return std::nullopt;
  const json::object packed =
      parse_object(it->second, file.path() + " __metadata__[\"" + std::string(kDiffusersMetadata) + "\"]");
  json::object out;
  for (const auto& kv : packed) {
    const std::string key(kv.key());
    if (key.rfind(kDiffusersPrefix, 0) == 0)
      out[key.substr(std::string(kDiffusersPrefix).size())] = kv.value();
    else if (key.find('.') == std::string::npos)
      out[key] = kv.value();
  }
  return out;
}

LoraAdapter paired(RawAdapter raw, int64_t rank, double alpha) {
  LoraAdapter out{rank, alpha, {}};
  for (auto& [name, f] : raw.modules) out.modules[name] = std::move(f);
  return out;
}

LoraAdapter read_peft(const std::string& config_path, const std::string& weights_path) {
  if (!fs::exists(weights_path)) fail("{}: PEFT adapter folder has no {}", config_path, kPeftWeights);
  const json::object config = parse_object(io::read_text_file(config_path), config_path);
  const io::SafetensorsFile file(weights_path);
  RawAdapter raw = raw_factors(file);
  const int64_t rank = uniform_rank(raw, weights_path);
  LoraAdapter adapter = paired(std::move(raw), rank, config_alpha(config, rank, config_path));
  adapter.validate(weights_path);
  return adapter;
}

LoraAdapter read_safetensors(const std::string& path) {
  const io::SafetensorsFile file(path);
  if (file.metadata().count(kBflLayoutKey))
    fail(
        "{}: a LoRA on Black Forest Labs' fused modules (FLUX.2's ComfyUI file) is for ComfyUI and diffusers; ditrl "
        "reads the pytorch_lora_weights.safetensors or PEFT folder of the same export",
        path);
  RawAdapter raw = raw_factors(file);
  const int64_t rank = uniform_rank(raw, path);
  double alpha = static_cast<double>(rank);  // diffusers' and ltx_core's reading without alpha: scale 1
  double b_unscale = 1.0;
  const auto& meta = file.metadata();
  if (const auto config = diffusers_config(file)) {
    alpha = config_alpha(*config, rank, path + " lora_adapter_metadata");
  } else if (meta.count("ditrl_lora_alpha") && meta.count("ditrl_lora_b_scaled")) {
    // ditrl's LTX-2 layout: lora_B holds (alpha/r) B; the trained factors come back.
    alpha = std::stod(meta.at("ditrl_lora_alpha"));
    b_unscale = static_cast<double>(rank) / alpha;
  } else if (!raw.alphas.empty()) {
    alpha = raw.alphas.begin()->second;
    for (const auto& [name, a] : raw.alphas)
      if (a != alpha)
        fail("{}: {}.alpha = {} but others are {}; per-module alphas are not supported", path, name, a, alpha);
    if (raw.alphas.size() != raw.modules.size())
      fail("{}: {} modules carry an .alpha and {} do not", path, raw.alphas.size(),
           raw.modules.size() - raw.alphas.size());
  }
  LoraAdapter adapter = paired(std::move(raw), rank, alpha);
  if (b_unscale != 1.0)
    for (auto& [name, f] : adapter.modules) f.b = f.b * b_unscale;
  adapter.validate(path);
  return adapter;
}

}  // namespace

void write_peft_adapter(const std::string& dir, const LoraAdapter& adapter, const LoraFileOptions& options) {
  adapter.validate("LoRA adapter for " + dir);
  fs::create_directories(dir);
  json::object config = lora_config(adapter);
  config["peft_type"] = "LORA";
  config["task_type"] = nullptr;
  config["inference_mode"] = true;
  config["modules_to_save"] = nullptr;
  config["rank_pattern"] = json::object();
  config["alpha_pattern"] = json::object();
  if (options.base_model.empty())
    config["base_model_name_or_path"] = nullptr;
  else
    config["base_model_name_or_path"] = options.base_model;
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";
  io::write_safetensors((fs::path(dir) / kPeftWeights).string(), factor_tensors(adapter, kPeftPrefix, options.dtype),
                        metadata);
  io::write_text_file((fs::path(dir) / kPeftConfig).string(), json::serialize(config) + "\n");
}

void write_lora_file(const std::string& path, LoraFormat format, const LoraAdapter& adapter,
                     const LoraFileOptions& options) {
  adapter.validate("LoRA adapter for " + path);
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";
  if (format == LoraFormat::Diffusers) {
    json::object packed;
    for (const auto& kv : lora_config(adapter))
      packed[std::string(kDiffusersPrefix) + std::string(kv.key())] = kv.value();
    metadata[kDiffusersMetadata] = json::serialize(packed);
    io::write_safetensors(path, factor_tensors(adapter, kDiffusersPrefix, options.dtype), metadata);
  } else if (format == LoraFormat::Ltx) {
    note_b_scaled(adapter, metadata);
    io::write_safetensors(path, factor_tensors(adapter, kLtxPrefix, options.dtype, adapter.scale()), metadata);
  } else {
    fail("write_lora_file: a PEFT adapter is a folder (write_peft_adapter)");
  }
}

bool has_comfyui_lora_layout(const std::string& family) {
  return family == "sd3" || family == "wan" || family == "qwen_image" || family == "flux" || family == "flux2";
}

namespace {

// FLUX.2's ComfyUI file (lora_files.hpp): the adapter on BFL's modules. A
// fused module's adapted parts share it: lora_A stacks their A factors,
// lora_B holds each part's (alpha/r) B in the part's rows and its columns
// (zero elsewhere), so B A is each part's update in its rows.
void write_bfl_lora(const std::string& path, const LoraAdapter& adapter, const LoraFileOptions& options) {
  struct Fused {
    const BflRule* rule = nullptr;
    std::map<size_t, const LoraFactors*> parts;
  };
  std::map<std::string, Fused> fused;
  for (const auto& [name, f] : adapter.modules) {
    const std::optional<BflPlace> place = bfl_place(name, flux2_bfl_layout());
    if (!place)
      fail("{}: flux2 layer {} has no name in Black Forest Labs' layout, which ComfyUI's model uses", path, name);
    if (place->rule->rows == BflRows::qkv_mlp) fail("{}: {} splits unevenly (FLUX.1's linear1)", path, place->module);
    fused[place->module].rule = place->rule;
    fused[place->module].parts[place->part] = &f;
  }
  io::NamedTensors tensors;
  for (const auto& [module, group] : fused) {
    const LoraFactors& first = *group.parts.begin()->second;
    const int64_t out = first.b.size(0), r = adapter.rank;
    at::Tensor b =
        at::zeros({out * static_cast<int64_t>(group.rule->to.size()), r * static_cast<int64_t>(group.parts.size())});
    std::vector<at::Tensor> a;
    for (const auto& [part, f] : group.parts) {
      const at::Tensor scaled = f->b.detach().to(at::kCPU, at::kFloat) * adapter.scale();
      b.slice(0, static_cast<int64_t>(part) * out, static_cast<int64_t>(part + 1) * out)
          .slice(1, static_cast<int64_t>(a.size()) * r, static_cast<int64_t>(a.size() + 1) * r)
          .copy_(scaled);
      a.push_back(f->a.detach().to(at::kCPU, at::kFloat));
    }
    if (group.rule->rows == BflRows::swap_halves) b = at::cat({b.chunk(2)[1], b.chunk(2)[0]});
    tensors.emplace_back(std::string(kLtxPrefix) + module + ".lora_A.weight", stored(at::cat(a), options.dtype));
    tensors.emplace_back(std::string(kLtxPrefix) + module + ".lora_B.weight", stored(b, options.dtype));
  }
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";
  note_b_scaled(adapter, metadata);
  metadata[kBflLayoutKey] = "black-forest-labs";
  io::write_safetensors(path, tensors, metadata);
}

}  // namespace

void write_comfyui_lora(const std::string& path, const std::string& family, const LoraAdapter& adapter,
                        const LoraFileOptions& options) {
  adapter.validate("LoRA adapter for " + path);
  if (!has_comfyui_lora_layout(family))
    fail(
        "{}: no ComfyUI LoRA layout for family '{}' (sd3, wan, qwen_image, flux, flux2; LTX-2's is "
        "ltx_lora.safetensors)",
        path, family);
  if (family == "flux2") return write_bfl_lora(path, adapter, options);
  const bool diffusers_names = family == "sd3" || family == "flux";
  const std::string prefix = diffusers_names ? kDiffusersPrefix : kLtxPrefix;
  // ComfyUI takes alpha with .item(): stored in fp32 whatever the factors'
  // dtype, so a bf16 export keeps a deck's alpha (64, 12, 0.5) exact.
  const at::Tensor alpha = at::scalar_tensor(adapter.alpha, at::kFloat);
  io::NamedTensors tensors;
  for (const auto& [name, f] : adapter.modules) {
    std::string key = name;
    if (family == "wan") {
      const auto wan = wan_rename(name, true);
      if (!wan) fail("{}: wan layer {} has no Wan checkpoint name, so ComfyUI's key map would not find it", path, name);
      key = *wan;
    }
    key = prefix + key;
    tensors.emplace_back(key + ".lora_A.weight", stored(f.a, options.dtype));
    tensors.emplace_back(key + ".lora_B.weight", stored(f.b, options.dtype));
    tensors.emplace_back(key + ".alpha", alpha);
  }
  std::map<std::string, std::string> metadata = options.metadata;
  metadata["format"] = "pt";
  io::write_safetensors(path, tensors, metadata);
}

std::string hub_repo_id(const std::string& path) {
  // The hub cache's layout: <cache>/models--<org>--<name>/snapshots/<revision>/<file>;
  // a repo id holds no "--", so the folder name splits back into it.
  const std::string marker = "models--";
  std::optional<std::string> repo;
  const fs::path p(path);
  for (auto it = p.begin(); it != p.end(); ++it) {
    const std::string part = it->string();
    const auto next = std::next(it);
    if (part.rfind(marker, 0) != 0 || next == p.end() || next->string() != "snapshots") continue;
    std::string id = part.substr(marker.size());
    if (const size_t dash = id.find("--"); dash != std::string::npos) id.replace(dash, 2, "/");
    if (!id.empty() && id.find("--") == std::string::npos) repo = id;
  }
  return repo.value_or("");
}

LoraAdapter read_lora_file(const std::string& path) {
  if (!fs::exists(path)) fail("LoRA adapter {}: no such file or folder", path);
  if (fs::is_directory(path)) {
    const fs::path dir(path);
    if (fs::exists(dir / kPeftConfig)) return read_peft((dir / kPeftConfig).string(), (dir / kPeftWeights).string());
    if (fs::exists(dir / kDiffusersWeights)) return read_safetensors((dir / kDiffusersWeights).string());
    fail("LoRA adapter folder {}: no {} (PEFT) and no {} (diffusers)", path, kPeftConfig, kDiffusersWeights);
  }
  const fs::path file(path);
  if (file.filename() == kPeftConfig) return read_peft(path, (file.parent_path() / kPeftWeights).string());
  const fs::path sibling = file.parent_path() / kPeftConfig;
  if (file.filename() == kPeftWeights && fs::exists(sibling)) return read_peft(sibling.string(), path);
  return read_safetensors(path);
}

}  // namespace ditrl::models
