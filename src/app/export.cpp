// `ditrl export CKPT --out DIR`: a training checkpoint in the formats the
// ecosystem loads as they are. The model is rebuilt from the deck the
// checkpoint stores (app/checkpoint_model.hpp), then:
//  - a LoRA run writes, in DIR,
//      adapter_config.json + adapter_model.safetensors   PEFT: PeftModel.from_pretrained(model, DIR)
//      pytorch_lora_weights.safetensors                  diffusers: pipe.load_lora_weights(DIR)
//      comfyui_lora.safetensors                          ComfyUI's LoraLoader (`.alpha` per module)
//    (SD3/SD3.5, Wan2.x, Qwen-Image), or for LTX-2 the PEFT folder and
//      ltx_lora.safetensors                              ltx_core's LoRA loader (ComfyUI layout)
//    and with --merged DIR/merged/: the full weights with the adapters folded in.
//    adapter_config.json names the base model only by a hub repo id
//    (models::hub_repo_id), never by a path of this machine;
//  - a full fine-tune writes the model folder itself: config.json +
//    diffusion_pytorch_model.safetensors (sharded with an index above
//    --max-shard-size), every parameter and persistent buffer, so that
//    `Model.from_pretrained(DIR)` / `load_state_dict(strict=True)` take it;
//    LTX-2: ltx_model.safetensors, ltx_core's single-file layout.
// A two-expert Wan2.2 model writes each expert into DIR/transformer/ and
// DIR/transformer_2/, the pipeline's component folders.
// Full weights are streamed: the model is built sliced (its base on the meta
// device) and each tensor is read from the base weights, the seeded init or
// the checkpoint, merged, cast and written at its offset before the next, so
// the process holds one tensor at a time, never the model.

#include <ditrl/app/checkpoint_model.hpp>
#include <ditrl/app/commands.hpp>
#include <ditrl/app/named_option.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/io/safetensors_shards.hpp>
#include <ditrl/io/text_file.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/linear.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

namespace ditrl::app {

namespace {

namespace fs = std::filesystem;

struct ExportCli {
  std::string checkpoint;
  std::string out;
  c10::ScalarType dtype = at::kFloat;
  std::string max_shard_size = "10GB";
  bool merged = false;
};

// One checkpoint's worth of the model: the whole family, or one Wan2.2
// expert with the folder named after its pipeline component.
struct Part {
  std::string folder;  // "" = DIR itself
  std::string prefix;  // the part's parameter-name prefix in the family ("transformer_2.")
  torch::nn::Module* module = nullptr;
};

std::vector<Part> parts_of(models::Family& family) {
  const std::vector<std::shared_ptr<torch::nn::Module>> experts = family.expert_modules();
  if (experts.size() < 2) return {{"", "", &family}};
  std::vector<Part> parts;
  for (size_t e = 0; e < experts.size(); ++e) {
    const std::string name = e == 0 ? "transformer" : "transformer_" + std::to_string(e + 1);
    parts.push_back({name, name + ".", experts[e].get()});
  }
  return parts;
}

// One tensor of a part's files: its stored name, its name in the family and
// whether a LoRA merge folds into it.
struct Entry {
  io::TensorSpec spec;
  std::string family_name;
  const models::Linear* merge = nullptr;
};

// The tensors of a part's full weights in the order its loader lists them
// (parameters, then buffers), floating ones stored in `dtype`: with
// `merged`, the LoRA factors are left out and each adapted weight carries
// its adapter, to be folded in as it is written.
std::vector<Entry> entries_of(const Part& part, StreamedCheckpointModel& m, c10::ScalarType dtype, bool merged) {
  std::map<std::string, const models::Linear*> adapted;
  if (merged)
    for (const auto& item : part.module->named_modules("", false))
      if (auto linear = std::dynamic_pointer_cast<models::Linear>(item.value()); linear && linear->has_lora())
        adapted[item.key() + ".weight"] = linear.get();
  std::vector<Entry> out;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    const auto it = adapted.find(name);
    out.push_back({{name, t.is_floating_point() ? dtype : t.scalar_type(), t.sizes().vec()},
                   m.family_name(t),
                   it != adapted.end() ? it->second : nullptr});
  };
  for (const auto& p : part.module->named_parameters())
    if (!merged || !precision::is_lora_name(p.key())) add(p.key(), p.value());
  for (const auto& b : part.module->named_buffers()) add(b.key(), b.value());
  return out;
}

// The full weights of one part as its loader reads them, streamed: each
// tensor is read (base source or checkpoint), merged, cast and written
// before the next, so no process holds the model.
std::vector<std::string> write_model(const std::string& dir, const Part& part, StreamedCheckpointModel& m,
                                     const ExportCli& cli, bool merged,
                                     const std::map<std::string, std::string>& metadata) {
  const c10::ScalarType dtype = cli.dtype;
  const bool ltx_core = models::traits_of(m.family()).export_layout == models::ExportLayout::LtxCore;
  // ltx_core's single-file checkpoint: the DiT under model.diffusion_model.,
  // its config in the metadata (LTXModelConfigurator.from_metadata).
  const std::string stored_prefix = ltx_core ? "model.diffusion_model." : "";
  std::vector<io::TensorSpec> specs;
  std::map<std::string, Entry> by_name;
  for (Entry& e : entries_of(part, m, dtype, merged)) {
    e.spec.name = stored_prefix + e.spec.name;
    specs.push_back(e.spec);
    by_name[e.spec.name] = std::move(e);
  }
  const io::TensorValues values = [&by_name, &m](const io::TensorSpec& spec) {
    const Entry& e = by_name.at(spec.name);
    const at::Tensor value = m.value(e.family_name);
    return e.merge ? e.merge->merged_weight(value) : value;
  };
  fs::create_directories(dir);
  const std::string config = models::traits_of(m.family()).config_json(m.family());
  if (ltx_core) {
    std::map<std::string, std::string> meta = metadata;
    meta["config"] = config;
    const std::string path = (fs::path(dir) / "ltx_model.safetensors").string();
    io::write_safetensors_streamed(path, specs, values, meta);
    return {path};
  }
  std::vector<std::string> written =
      io::write_sharded_safetensors_streamed(dir, "diffusion_pytorch_model", specs, values,
                                             io::parse_byte_size(cli.max_shard_size, "--max-shard-size"), metadata);
  written.push_back((fs::path(dir) / "config.json").string());
  io::write_text_file(written.back(), config + "\n");
  return written;
}

std::vector<std::string> write_lora(const std::string& dir, const models::Family& family,
                                    const models::LoraAdapter& adapter, const models::LoraFileOptions& options) {
  models::write_peft_adapter(dir, adapter, options);
  std::vector<std::string> written{(fs::path(dir) / "adapter_config.json").string(),
                                   (fs::path(dir) / "adapter_model.safetensors").string()};
  if (models::traits_of(family).export_layout == models::ExportLayout::LtxCore) {
    written.push_back((fs::path(dir) / "ltx_lora.safetensors").string());
    models::write_lora_file(written.back(), models::LoraFormat::Ltx, adapter, options);
  } else {
    written.push_back((fs::path(dir) / "pytorch_lora_weights.safetensors").string());
    models::write_lora_file(written.back(), models::LoraFormat::Diffusers, adapter, options);
    if (models::has_comfyui_lora_layout(family.family_name())) {
      written.push_back((fs::path(dir) / "comfyui_lora.safetensors").string());
      models::write_comfyui_lora(written.back(), family.family_name(), adapter, options);
    }
  }
  return written;
}

int export_command(const ExportCli& cli) {
  const c10::ScalarType dtype = cli.dtype;
  io::parse_byte_size(cli.max_shard_size, "--max-shard-size");  // a bad size fails before any work
  StreamedCheckpointModel m(cli.checkpoint);
  models::Family& family = m.family();
  const config::Config& c = m.config();
  const std::map<std::string, std::string> metadata{{"ditrl_checkpoint", cli.checkpoint},
                                                    {"ditrl_family", c.model.family}};
  std::vector<std::string> written;
  auto add = [&written](const std::vector<std::string>& files) {
    written.insert(written.end(), files.begin(), files.end());
  };
  const std::vector<Part> parts = parts_of(family);
  if (m.lora()) {
    const models::LoraAdapter adapter = models::lora_adapter_of(family);
    std::vector<Part> adapted;
    for (const Part& part : parts) {
      models::LoraFileOptions options{
          dtype, models::hub_repo_id(part.prefix == "transformer_2." ? c.model.weights_2 : c.model.weights), metadata};
      const models::LoraAdapter mine = part.prefix.empty() ? adapter : adapter.under(part.prefix);
      if (mine.modules.empty()) continue;  // an expert the deck's targets left alone
      add(write_lora((fs::path(cli.out) / part.folder).string(), family, mine, options));
      adapted.push_back(part);
    }
    // The merged weights after every adapter file: the base is read in the
    // family's order, expert by expert.
    if (cli.merged)
      for (const Part& part : adapted)
        add(write_model((fs::path(cli.out) / "merged" / part.folder).string(), part, m, cli, true, metadata));
  } else {
    if (cli.merged)
      fail("--merged: {} is a full fine-tune (no LoRA to merge); its export is the full model", cli.checkpoint);
    for (const Part& part : parts)
      add(write_model((fs::path(cli.out) / part.folder).string(), part, m, cli, false, metadata));
  }
  std::cout << fmt::format("exported {} ({} trained tensors, {}{}):\n", cli.checkpoint, m.trained_tensors(),
                           c.model.family, m.lora() ? ", LoRA" : "");
  for (const std::string& path : written) std::cout << "  " << path << "\n";
  return 0;
}

}  // namespace

void add_export_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<ExportCli>();
  CLI::App* sub = app.add_subcommand(
      "export", "Write a checkpoint as diffusers/PEFT/LTX-2 files (LoRA adapters or the full model folder)");
  sub->add_option("checkpoint", cli->checkpoint, "Training checkpoint (OUT/checkpoints/step-N.h5)")->required();
  sub->add_option("--out", cli->out, "Output directory")->required();
  add_named_option(*sub, "--dtype", cli->dtype, precision::kDtypeNames, "Stored dtype: fp32 (default), bf16 or fp16");
  sub->add_option("--max-shard-size", cli->max_shard_size,
                  "Full weights above this size are sharded with an index, as diffusers saves them (default 10GB)");
  sub->add_flag("--merged", cli->merged, "LoRA runs: also write DIR/merged/, the full model with the adapters merged");
  sub->callback([cli, &selected] { selected = [cli] { return export_command(*cli); }; });
}

}  // namespace ditrl::app
