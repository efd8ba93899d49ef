// `ditrl forward`: one family forward on inputs stored under the reference
// argument names (a fixture case, or a case written by hand), outputs as
// safetensors. The weights come from a safetensors checkpoint (--weights) or
// a training checkpoint (--checkpoint step-N.h5: LoRA or full, written by
// any number of ranks); --lora adds a PEFT / diffusers / LTX-2 adapter on top.

#include <ditrl/app/checkpoint_model.hpp>
#include <ditrl/app/commands.hpp>
#include <ditrl/app/named_option.hpp>
#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/lora_adapter.hpp>
#include <ditrl/models/lora_files.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/unit.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/dtype.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <iostream>
#include <memory>

namespace ditrl::app {

namespace {

struct ForwardOptions {
  std::string family;
  std::string preset = "tiny";
  std::string config;
  std::string weights;
  std::string checkpoint;
  std::string lora;
  std::string inputs;
  std::string out;
  c10::ScalarType dtype = at::kFloat;
  models::AttentionBackend attention = models::AttentionBackend::Math;
  bool intermediates = false;
  int threads = 0;
};

// The model with its weights: a training checkpoint's, or a safetensors file's.
std::shared_ptr<models::Family> build_model(ForwardOptions& o) {
  if (!o.checkpoint.empty()) {
    if (!o.weights.empty() || !o.config.empty())
      fail("--checkpoint {} brings its own model (the deck it stores); drop --weights and --config", o.checkpoint);
    CheckpointModel m = load_checkpoint_model(o.checkpoint, o.attention);
    if (!o.family.empty() && o.family != m.config.model.family)
      fail("--family {} but checkpoint {} holds a {} model", o.family, o.checkpoint, m.config.model.family);
    o.family = m.config.model.family;
    if (m.lora && !o.lora.empty())
      fail("--lora {}: checkpoint {} is a LoRA run and already holds its adapters", o.lora, o.checkpoint);
    return m.family;
  }
  if (o.family.empty() || o.weights.empty()) fail("forward needs --family and --weights, or --checkpoint");
  models::FamilyOptions options;
  options.family = o.family;
  options.preset = o.preset;
  options.config_json = o.config;
  options.attention = o.attention;
  const auto family = models::create_family(options);
  models::load_weights(*family, models::open_checkpoint(*family, o.weights));
  return family;
}

// The first tensor the forward records, in forward order, that is not finite.
class FirstNonFinite : public models::Tap {
 public:
  void record(const std::string& module, const std::string& name, const at::Tensor& value) override {
    if (first.empty() && !at::isfinite(value).all().item<bool>()) first = module + "/" + name;
  }
  std::string first;
};

// Finite weights can still overflow inside the forward (magnitudes near
// 1e36): such outputs are an error naming where the values first go bad,
// never a file of NaNs with exit code 0.
void check_finite_outputs(models::Family& family, const models::ReferenceCase& reference_case,
                          const std::map<std::string, at::Tensor>& outputs) {
  std::vector<models::NonFinite> bad;
  for (const auto& [name, tensor] : outputs)
    if (auto found = models::find_nonfinite(name, tensor)) bad.push_back(*found);
  if (bad.empty()) return;
  torch::NoGradGuard no_grad;
  FirstNonFinite watch;
  models::ForwardContext ctx;
  ctx.tap = &watch;
  family.reference_forward(reference_case.inputs, reference_case.extra_json, ctx);
  fail(
      "{}: the forward's outputs hold non-finite values: {}; the first recorded tensor that does: {}; the weights "
      "are finite, so values overflow inside the forward (no output written)",
      reference_case.path, models::describe_nonfinite(bad), watch.first.empty() ? "(none recorded)" : watch.first);
}

int forward(ForwardOptions o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  const auto family = build_model(o);
  if (!o.lora.empty()) {
    if (family->expert_modules().size() > 1)
      fail("--lora {}: a two-expert model takes one adapter per expert; merge them with `ditrl export` instead",
           o.lora);
    models::attach_lora_adapter(*family, models::read_lora_file(o.lora), o.lora);
  }
  // Checked before the cast: a bf16 cast can also overflow finite weights,
  // but what is reported here is what the file holds.
  std::vector<models::NonFinite> nonfinite;
  for (const auto& [name, tensor] : models::state_tensors(*family))
    if (auto found = models::find_nonfinite(name, tensor)) nonfinite.push_back(*found);
  if (!nonfinite.empty())
    fail("{}: {} weight tensor(s) hold non-finite values: {}", o.checkpoint.empty() ? o.weights : o.checkpoint,
         nonfinite.size(), models::describe_nonfinite(nonfinite));
  models::cast_parameters(*family, o.dtype, family->default_overrides());
  const models::ReferenceCase reference_case = models::load_reference_case(o.inputs);
  const auto outputs = models::run_reference_case(*family, reference_case, o.intermediates);
  check_finite_outputs(*family, reference_case, outputs);

  io::NamedTensors tensors(outputs.begin(), outputs.end());
  io::write_safetensors(o.out, tensors,
                        {{"format", "pt"},
                         {"producer", fmt::format("ditrl {} ({})", build::kVersion, build::git_commit())},
                         {"family", o.family},
                         {"config", o.config.empty() ? "preset " + o.preset : o.config},
                         {"weights", o.weights},
                         {"checkpoint", o.checkpoint},
                         {"lora", o.lora},
                         {"inputs", o.inputs},
                         {"dtype", precision::dtype_name(o.dtype)},
                         {"attention", std::string(name_of(models::kAttentionNames, o.attention))}});
  const std::string source = o.checkpoint.empty() ? o.weights : o.checkpoint;
  std::cout << fmt::format("# {} forward of {}{} on {} ({}), {} tensors written to {}\n", o.family, source,
                           o.lora.empty() ? "" : " + LoRA " + o.lora, o.inputs, precision::dtype_name(o.dtype),
                           tensors.size(), o.out);
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
  sub->add_option("--family", o->family, "model family (with --checkpoint: taken from its deck)");
  sub->add_option("--config", o->config, "config.json of the model (replaces --preset)");
  sub->add_option("--preset", o->preset, "size preset of the family (default tiny)");
  sub->add_option("--weights", o->weights, "safetensors checkpoint or *.index.json");
  sub->add_option("--checkpoint", o->checkpoint,
                  "training checkpoint (OUT/checkpoints/step-N.h5, LoRA or full) instead of --weights");
  sub->add_option("--lora", o->lora, "LoRA adapter to apply: PEFT folder, diffusers or LTX-2 LoRA file");
  sub->add_option("--inputs", o->inputs,
                  "safetensors with the forward's tensor arguments (non-tensor ones in the JSON sidecar next to it)")
      ->required();
  sub->add_option("--out", o->out, "output safetensors: `output` (+ intermediate.<module>.out<i>)")->required();
  add_named_option(*sub, "--dtype", o->dtype, precision::kDtypeNames,
                   "forward dtype of the parameters (the family's overrides stay)");
  // `ditrl forward` runs on the host, where only these two kernels exist.
  add_named_option(*sub, "--attention", o->attention, models::kAttentionNames,
                   {models::AttentionBackend::Math, models::AttentionBackend::Flash},
                   "attention backend (the forward runs on the CPU): math | flash");
  sub->add_flag("--intermediates", o->intermediates, "also write the block outputs the fixtures store");
  sub->add_option("--threads", o->threads, "intra-op threads (default: LibTorch's)");
  sub->callback([o, &selected] { selected = [o] { return forward(*o); }; });
}

}  // namespace ditrl::app
