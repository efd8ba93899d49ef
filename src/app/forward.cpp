#include <ditrl/app/commands.hpp>
#include <ditrl/build_info.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace ditrl::app {

namespace {

struct ForwardOptions {
  std::string family;
  std::string preset = "tiny";
  std::string config;
  std::string weights;
  std::string inputs;
  std::string out;
  std::string dtype = "fp32";
  std::string attention = "math";
  bool intermediates = false;
  int threads = 0;
};

int forward(const ForwardOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  models::FamilyOptions options;
  options.family = o.family;
  options.preset = o.preset;
  options.config_json = o.config;
  options.attention = o.attention;
  const auto family = models::create_family(options);
  models::load_weights(*family, io::Checkpoint(o.weights));
  const c10::ScalarType dtype = precision::parse_dtype(o.dtype);
  models::cast_parameters(*family, dtype, family->default_overrides());
  const models::ReferenceCase reference_case = models::load_reference_case(o.inputs);
  const auto outputs = models::run_reference_case(*family, reference_case, o.intermediates);

  io::NamedTensors tensors(outputs.begin(), outputs.end());
  io::write_safetensors(o.out, tensors,
                        {{"format", "pt"},
                         {"producer", fmt::format("ditrl {} ({})", build::kVersion, build::kGitCommit)},
                         {"family", o.family},
                         {"config", o.config.empty() ? "preset " + o.preset : o.config},
                         {"weights", o.weights},
                         {"inputs", o.inputs},
                         {"dtype", o.dtype},
                         {"attention", o.attention}});
  std::cout << fmt::format("# {} forward of {} on {} ({}), {} tensors written to {}\n", o.family, o.weights, o.inputs,
                           o.dtype, tensors.size(), o.out);
  // Outputs the inputs file also carries (a reference run) are compared.
  for (const auto& [name, value] : outputs) {
    const auto stored = reference_case.stored.find(name);
    const bool comparable = stored != reference_case.stored.end() && stored->second.sizes() == value.sizes();
    std::string line =
        fmt::format("{}  {}  [{}]", name, c10::toString(value.scalar_type()), fmt::join(value.sizes(), ", "));
    if (comparable) {
      const double diff = (value.to(at::kDouble) - stored->second.to(at::kDouble)).abs().max().item<double>();
      line += fmt::format("  max |ditrl - stored| = {:.3e}", diff);
    }
    std::cout << line << "\n";
  }
  return 0;
}

}  // namespace

void add_forward_command(CLI::App& app, Command& selected) {
  auto o = std::make_shared<ForwardOptions>();
  CLI::App* sub = app.add_subcommand(
      "forward", "Run one family forward on inputs stored under the reference argument names and write the outputs");
  sub->add_option("--family", o->family, "model family")->required();
  sub->add_option("--config", o->config, "config.json of the model (replaces --preset)");
  sub->add_option("--preset", o->preset, "size preset of the family (default tiny)");
  sub->add_option("--weights", o->weights, "safetensors checkpoint or *.index.json")->required();
  sub->add_option("--inputs", o->inputs,
                  "safetensors with the forward's tensor arguments (non-tensor ones in the JSON sidecar next to it)")
      ->required();
  sub->add_option("--out", o->out, "output safetensors: `output` (+ intermediate.<module>.out<i>)")->required();
  sub->add_option("--dtype", o->dtype, "forward dtype of the parameters (the family's overrides stay)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--attention", o->attention, "attention backend: math | flash | efficient (CUDA builds)");
  sub->add_flag("--intermediates", o->intermediates, "also write the block outputs the fixtures store");
  sub->add_option("--threads", o->threads, "intra-op threads (default: LibTorch's)");
  sub->callback([o, &selected] { selected = [o] { return forward(*o); }; });
}

}  // namespace ditrl::app
