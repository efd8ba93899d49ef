#include <ditrl/app/commands.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>

#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace ditrl::app {

namespace {

struct InspectOptions {
  std::string file;
  std::string family;
  std::string preset = "tiny";
  std::string config;
  bool values = true;
};

int inspect(const InspectOptions& o) {
  const io::Checkpoint checkpoint(o.file);
  uint64_t total = 0;
  for (const std::string& name : checkpoint.names()) total += checkpoint.info(name).nbytes();
  std::cout << fmt::format("# {}: {} tensors, {} bytes in {} file(s)\n", o.file, checkpoint.names().size(), total,
                           checkpoint.files().size());
  for (const auto& [key, value] : checkpoint.metadata())
    std::cout << fmt::format("# metadata {} = {}\n", key, value.size() > 100 ? value.substr(0, 97) + "..." : value);
  std::vector<models::NonFinite> nonfinite;
  for (const std::string& name : checkpoint.names()) {
    const io::TensorInfo& t = checkpoint.info(name);
    std::string line = fmt::format("{}  {}  [{}]  {}", name, t.dtype, fmt::join(t.shape, ", "), t.nbytes());
    if (o.values)
      if (auto found = models::find_nonfinite(name, checkpoint.view(name))) {
        line += fmt::format("  NON-FINITE: {} NaN, {} Inf", found->nan, found->inf);
        nonfinite.push_back(*found);
      }
    std::cout << line << "\n";
  }
  if (!nonfinite.empty()) {
    std::cout << std::flush;
    fail("{}: {} tensor(s) hold non-finite values: {}", o.file, nonfinite.size(),
         models::describe_nonfinite(nonfinite));
  }
  if (o.family.empty()) return 0;
  models::FamilyOptions options;
  options.family = o.family;
  options.preset = o.preset;
  options.config_json = o.config;
  options.device = c10::kMeta;  // shapes only: real-size presets allocate nothing
  const auto family = models::create_family(options);
  const io::Checkpoint as_read = models::open_checkpoint(*family, o.file);
  models::validate_checkpoint(*family, as_read);
  int64_t params = 0;
  for (const auto& p : family->parameters()) params += p.numel();
  size_t skipped = 0;
  for (const std::string& name : as_read.names()) skipped += !family->checkpoint_name(name);
  std::cout << fmt::format("# matches family {} ({}): {} parameters{}{}\n", o.family,
                           o.config.empty() ? "preset " + o.preset : o.config, params,
                           as_read.regrouped()
                               ? fmt::format("; {} stored tensors regrouped into {} parameters", as_read.regrouped(),
                                             as_read.names().size() + as_read.regrouped() - checkpoint.names().size())
                               : "",
                           skipped ? fmt::format("; {} tensors of the file are not part of the model", skipped) : "");
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, Command& selected) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand(
      "inspect", "List the tensors of a safetensors checkpoint (or *.index.json) and optionally validate them");
  sub->add_option("file", o->file, "safetensors file or sharded *.safetensors.index.json")->required();
  sub->add_option("--family", o->family, "validate names and shapes against this model family");
  sub->add_option("--preset", o->preset, "size preset of the family (default tiny)");
  sub->add_option("--config", o->config, "config.json of the model (replaces --preset)");
  sub->add_flag("!--no-values", o->values,
                "skip reading the values (by default every floating tensor is checked for NaN/Inf, which is an error)");
  sub->callback([o, &selected] { selected = [o] { return inspect(*o); }; });
}

}  // namespace ditrl::app
