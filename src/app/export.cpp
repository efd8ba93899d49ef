// `ditrl export CKPT --out DIR`: a training checkpoint's weights as
// safetensors under checkpoint names. The model is rebuilt from the deck the
// checkpoint stores (its preset or config, its base weights or seeded init),
// the trained parameters are copied in, and then:
//  - a LoRA run writes DIR/adapter_model.safetensors (PEFT names, what
//    diffusers' load_lora_weights and PEFT read) and, with --merged, the base
//    weights with the adapters folded in;
//  - a full fine-tune writes DIR/diffusion_pytorch_model.safetensors with
//    every parameter and persistent buffer, fp32 or --dtype.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/precision/names.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <iostream>

namespace ditrl::app {

namespace {

struct ExportCli {
  std::string checkpoint;
  std::string out;
  std::string dtype = "fp32";
  bool merged = false;
};

std::shared_ptr<models::Family> rebuild(const config::Config& c) {
  std::shared_ptr<models::Family> family = models::create_family(family_options(c, c10::kCPU));
  load_deck_weights(*family, c);
  return family;
}

io::NamedTensors cast_all(io::NamedTensors tensors, c10::ScalarType dtype) {
  for (auto& [name, t] : tensors)
    if (t.is_floating_point()) t = t.to(dtype);
  return tensors;
}

int export_command(const ExportCli& cli) {
  const std::string deck_text = io::h5::File::open(cli.checkpoint).string_attr("deck");
  const config::Config config = config::parse_deck(deck_text, cli.checkpoint + " (stored deck)");
  const c10::ScalarType dtype = precision::parse_dtype(cli.dtype);
  std::shared_ptr<models::Family> family = rebuild(config);

  const std::map<std::string, at::Tensor> trained = io::read_checkpoint_weights(cli.checkpoint);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> params;
    for (auto& item : family->named_parameters()) params[item.key()] = item.value();
    for (const auto& [name, value] : trained) {
      auto it = params.find(precision::canonical_name(name));
      if (it == params.end())
        fail("{}: trained parameter '{}' is not in the {} model the stored deck builds", cli.checkpoint, name,
             config.model.family);
      it->second.copy_(value.view(it->second.sizes()));
    }
  }

  std::filesystem::create_directories(cli.out);
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"ditrl_checkpoint", cli.checkpoint}};
  std::vector<std::string> written;
  if (config.model.lora.enabled) {
    const std::string path = (std::filesystem::path(cli.out) / "adapter_model.safetensors").string();
    io::write_safetensors(path, cast_all(models::lora_state(*family, /*peft_names=*/true), dtype), metadata);
    written.push_back(path);
    if (cli.merged) {
      const std::string merged = (std::filesystem::path(cli.out) / "diffusion_pytorch_model.safetensors").string();
      io::write_safetensors(merged, cast_all(models::merged_state(*family), dtype), metadata);
      written.push_back(merged);
    }
  } else {
    const std::string path = (std::filesystem::path(cli.out) / "diffusion_pytorch_model.safetensors").string();
    io::write_safetensors(path, cast_all(models::state_tensors(*family), dtype), metadata);
    written.push_back(path);
  }
  for (const std::string& path : written)
    std::cout << "wrote " << path << " (" << trained.size() << " trained tensors from " << cli.checkpoint << ")\n";
  return 0;
}

}  // namespace

void add_export_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<ExportCli>();
  CLI::App* sub = app.add_subcommand("export", "Write a checkpoint's trained weights (or LoRA pairs) as safetensors");
  sub->add_option("checkpoint", cli->checkpoint, "Training checkpoint (OUT/checkpoints/step-N.h5)")->required();
  sub->add_option("--out", cli->out, "Output directory")->required();
  sub->add_option("--dtype", cli->dtype, "Stored dtype: fp32 (default), bf16 or fp16");
  sub->add_flag("--merged", cli->merged, "LoRA runs: also write the base weights with the adapters merged in");
  sub->callback([cli, &selected] { selected = [cli] { return export_command(*cli); }; });
}

}  // namespace ditrl::app
