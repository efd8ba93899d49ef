// `ditrl encode-prompts --encoder ENCODER.pt --prompts prompts.jsonl --out prompts.h5`
// runs a TorchScript text encoder over a JSONL prompt file and writes the
// prompt dataset the trainer reads (layout in rollout/prompts.hpp).
//
// prompts.jsonl, one JSON object per line:
//   {"prompt": "a red cube", "tokens": {"clip_l": [49406, ...], "t5": [...]}}
// `tokens` holds the ids of every tokenizer the encoder reads, padded to one
// length per tokenizer (tools/export_text_encoder.py tokenize writes them:
// tokenizers are Python code that TorchScript cannot carry). A line with
// "negative": true is the negative prompt of CFG runs (at most one).
// The encoder: forward(tokens: Dict[str, Tensor]) -> Dict[str, Tensor], inputs
// [B, L] int64, outputs [B, ...] named like the family's conditioning tensors;
// a string attribute `identity` names it in the dataset's attributes.

#include <ditrl/app/commands.hpp>
#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/sha256.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rollout/prompts.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/script.h>
#include <boost/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>

namespace ditrl::app {

namespace {

struct EncodeCli {
  std::string encoder;
  std::string prompts;
  std::string out;
  std::string family;
  std::string preset = "tiny";
  std::string config;
  int64_t batch = 16;
};

struct PromptLine {
  std::string text;
  std::map<std::string, std::vector<int64_t>> tokens;
};

struct PromptFile {
  std::vector<PromptLine> prompts;
  std::optional<PromptLine> negative;
};

PromptLine parse_line(const boost::json::value& value, const std::string& where) {
  if (!value.is_object()) fail("{}: expected a JSON object", where);
  const boost::json::object& o = value.as_object();
  const boost::json::value* prompt = o.if_contains("prompt");
  if (!prompt || !prompt->is_string()) fail("{}: expected a string \"prompt\"", where);
  const boost::json::value* tokens = o.if_contains("tokens");
  if (!tokens || !tokens->is_object() || tokens->as_object().empty())
    fail("{}: expected \"tokens\": {{\"<tokenizer>\": [ids...]}} (see tools/export_text_encoder.py tokenize)", where);
  PromptLine line{std::string(prompt->as_string()), {}};
  for (const auto& [name, ids] : tokens->as_object()) {
    if (!ids.is_array() || ids.as_array().empty())
      fail("{}: tokens.{} must be a non-empty array of token ids", where, std::string(name));
    for (const boost::json::value& id : ids.as_array()) {
      if (!id.is_int64() && !id.is_uint64())
        fail("{}: tokens.{} holds {}, not an integer token id", where, std::string(name), boost::json::serialize(id));
      line.tokens[std::string(name)].push_back(id.to_number<int64_t>());
    }
  }
  return line;
}

PromptFile read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open the prompt file", path);
  PromptFile file;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, number);
    boost::system::error_code ec;
    const boost::json::value value = boost::json::parse(text, ec);
    if (ec) fail("{}: not valid JSON ({})", where, ec.message());
    PromptLine line = parse_line(value, where);
    const boost::json::value* negative = value.as_object().if_contains("negative");
    if (negative && negative->is_bool() && negative->as_bool()) {
      if (file.negative) fail("{}: a second negative prompt (one is allowed)", where);
      file.negative = std::move(line);
    } else {
      file.prompts.push_back(std::move(line));
    }
  }
  if (file.prompts.empty()) fail("{}: no prompts", path);
  const PromptLine& first = file.prompts.front();
  auto check_like_first = [&](const PromptLine& line, const std::string& what) {
    for (const auto& [name, ids] : first.tokens) {
      auto it = line.tokens.find(name);
      if (it == line.tokens.end()) fail("{}: {} has no tokens.{} (the first prompt has)", path, what, name);
      if (it->second.size() != ids.size())
        fail("{}: {} has {} tokens.{} ids, the first prompt {}; pad every prompt to one length per tokenizer", path,
             what, it->second.size(), name, ids.size());
    }
    if (line.tokens.size() != first.tokens.size()) fail("{}: {} has tokenizers the first prompt lacks", path, what);
  };
  for (size_t i = 1; i < file.prompts.size(); ++i)
    check_like_first(file.prompts[i], fmt::format("prompt {} (\"{}\")", i, file.prompts[i].text));
  if (file.negative) check_like_first(*file.negative, "the negative prompt");
  return file;
}

std::map<std::string, at::Tensor> encode(torch::jit::Module& encoder, const std::vector<const PromptLine*>& lines,
                                         const std::string& encoder_path) {
  c10::Dict<std::string, at::Tensor> tokens;
  for (const auto& [name, ids] : lines.front()->tokens) {
    at::Tensor t = at::empty({static_cast<int64_t>(lines.size()), static_cast<int64_t>(ids.size())}, at::kLong);
    for (size_t i = 0; i < lines.size(); ++i)
      std::copy(lines[i]->tokens.at(name).begin(), lines[i]->tokens.at(name).end(),
                t.data_ptr<int64_t>() + i * ids.size());
    tokens.insert(name, t);
  }
  c10::IValue out;
  try {
    out = encoder.forward({tokens});
  } catch (const c10::Error& e) {
    fail("encoder {}: forward(tokens) failed: {}", encoder_path, e.what_without_backtrace());
  }
  if (!out.isGenericDict())
    fail("encoder {}: forward must return Dict[str, Tensor], got {}", encoder_path, out.tagKind());
  std::map<std::string, at::Tensor> result;
  for (const auto& item : out.toGenericDict()) {
    if (!item.key().isString() || !item.value().isTensor())
      fail("encoder {}: forward must return Dict[str, Tensor]", encoder_path);
    const at::Tensor value = item.value().toTensor();
    if (value.dim() < 1 || value.size(0) != static_cast<int64_t>(lines.size()))
      fail("encoder {}: output '{}' has shape [{}], expected [{}, ...] (one row per prompt)", encoder_path,
           item.key().toStringRef(), fmt::join(value.sizes(), ", "), lines.size());
    result[item.key().toStringRef()] = value.detach().cpu();
  }
  return result;
}

// Matches the encoder's outputs to the family's conditioning tensors: same
// names, same per-prompt shapes, cast to the family's dtypes.
models::Cond conform(std::map<std::string, at::Tensor> outputs, const std::vector<models::CondSpec>& spec,
                     const std::string& encoder_path) {
  models::Cond cond;
  if (spec.empty()) {
    for (auto& [name, t] : outputs) cond.tensors[name] = t.is_floating_point() ? t.to(at::kFloat) : t;
    return cond;
  }
  for (const models::CondSpec& s : spec) {
    auto it = outputs.find(s.name);
    if (it == outputs.end()) {
      std::vector<std::string> names;
      for (const auto& item : outputs) names.push_back(item.first);
      fail("encoder {}: no output '{}' (the family needs it); outputs are {}", encoder_path, s.name,
           fmt::join(names, ", "));
    }
    const at::IntArrayRef per_prompt = it->second.sizes().slice(1);
    if (per_prompt != at::IntArrayRef(s.shape))
      fail("encoder {}: output '{}' is [B, {}] per batch, the family expects [B, {}]", encoder_path, s.name,
           fmt::join(per_prompt, ", "), fmt::join(s.shape, ", "));
    cond.tensors[s.name] = it->second.to(s.dtype);
    outputs.erase(it);
  }
  if (!outputs.empty())
    fail("encoder {}: output '{}' is not a conditioning tensor of the family", encoder_path, outputs.begin()->first);
  return cond;
}

std::vector<models::CondSpec> family_cond_spec(const EncodeCli& o) {
  if (o.family.empty()) return {};
  models::FamilyOptions options;
  options.family = o.family;
  options.preset = o.preset;
  options.config_json = o.config;
  options.device = c10::kMeta;
  return models::create_family(options)->cond_spec();
}

int run_encode(const EncodeCli& o) {
  const PromptFile file = read_prompt_file(o.prompts);
  const std::vector<models::CondSpec> spec = family_cond_spec(o);
  if (!std::filesystem::exists(o.encoder)) fail("encoder {}: no such file", o.encoder);
  torch::jit::Module encoder;
  try {
    encoder = torch::jit::load(o.encoder, at::kCPU);
  } catch (const c10::Error& e) {
    fail("encoder {}: not a TorchScript module: {}", o.encoder, e.what_without_backtrace());
  }
  encoder.eval();
  const torch::NoGradGuard no_grad;

  std::map<std::string, std::vector<at::Tensor>> parts;
  std::vector<std::string> texts;
  for (size_t begin = 0; begin < file.prompts.size(); begin += static_cast<size_t>(o.batch)) {
    std::vector<const PromptLine*> lines;
    for (size_t i = begin; i < std::min(file.prompts.size(), begin + static_cast<size_t>(o.batch)); ++i) {
      lines.push_back(&file.prompts[i]);
      texts.push_back(file.prompts[i].text);
    }
    for (auto& [name, t] : conform(encode(encoder, lines, o.encoder), spec, o.encoder).tensors)
      parts[name].push_back(t);
    std::cerr << fmt::format("encode-prompts: {}/{} prompts\n", texts.size(), file.prompts.size());
  }
  models::Cond cond, negative;
  for (auto& [name, list] : parts) cond.tensors[name] = at::cat(list);
  if (file.negative) negative = conform(encode(encoder, {&*file.negative}, o.encoder), spec, o.encoder);

  std::map<std::string, std::string> attributes{
      {"encoder", std::filesystem::absolute(o.encoder).string()},
      {"encoder_sha256", io::sha256_file(o.encoder)},
      {"prompts_file", std::filesystem::absolute(o.prompts).string()},
      {"prompts_sha256", io::sha256_file(o.prompts)},
      {"producer", fmt::format("ditrl {} ({}) encode-prompts", build::kVersion, build::git_commit())}};
  if (encoder.hasattr("identity") && encoder.attr("identity").isString())
    attributes["encoder_identity"] = encoder.attr("identity").toStringRef();
  if (!o.family.empty()) attributes["family"] = o.family + (o.config.empty() ? ":" + o.preset : ":" + o.config);
  if (file.negative) attributes["negative_prompt"] = file.negative->text;

  // Written under a temporary name and renamed: a failed run leaves no half-written dataset.
  const std::string tmp = o.out + ".tmp";
  rollout::write_prompt_dataset(tmp, texts, cond, negative, attributes);
  std::filesystem::rename(tmp, o.out);
  std::cout << fmt::format("wrote {}: {} prompts{}\n", o.out, texts.size(),
                           file.negative ? " and a negative prompt" : "");
  return 0;
}

}  // namespace

void add_encode_prompts_command(CLI::App& app, Command& selected) {
  auto options = std::make_shared<EncodeCli>();
  CLI::App* cmd = app.add_subcommand("encode-prompts",
                                     "Run a TorchScript text encoder over a JSONL prompt file into a prompt dataset");
  cmd->add_option("--encoder", options->encoder, "TorchScript encoder: forward(Dict[str, Tensor]) -> Dict[str, Tensor]")
      ->required();
  cmd->add_option("--prompts", options->prompts, "JSONL: {\"prompt\": ..., \"tokens\": {name: [ids]}} per line")
      ->required();
  cmd->add_option("--out", options->out, "HDF5 prompt dataset to write")->required();
  cmd->add_option("--family", options->family, "check the outputs against this family's conditioning tensors");
  cmd->add_option("--preset", options->preset, "size preset of --family (default tiny)");
  cmd->add_option("--config", options->config, "config.json of the model (replaces --preset)");
  cmd->add_option("--batch", options->batch, "prompts per encoder call")->check(CLI::PositiveNumber);
  cmd->callback([options, &selected] { selected = [options] { return run_encode(*options); }; });
}

}  // namespace ditrl::app
