// Black Forest Labs' own single-file layout for FLUX.1 and FLUX.2
// (models/flux/bfl_checkpoint.hpp): tests/fixtures/<family>/bfl.safetensors
// holds the fixture's weights in that layout, checked by BFL's reference
// FLUX.1 model and by diffusers' FLUX.2 converter when it was made
// (tests/fixtures/bfl_layout.py, bfl.json). Read under diffusers' names it
// must give the diffusers-layout weights bit for bit; sliced loading of it is
// in test_family_contract.cpp.

#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"
#include "same_bits.hpp"

#include <functional>
#include <string>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_path;

namespace {

// Parameters of `a` that differ from `b`'s bitwise.
std::vector<std::string> differing(Family& a, Family& b) {
  std::vector<std::string> out;
  auto other = b.named_parameters();
  for (const auto& p : a.named_parameters())
    if (!test::same_bits(p.value(), other[p.key()])) out.push_back(p.key());
  return out;
}

// bfl.safetensors rewritten through `edit` (name, tensor) -> tensors to write.
std::string edited_bfl(const std::string& family, const std::string& label,
                       const std::function<void(const std::string&, const at::Tensor&, io::NamedTensors&)>& edit) {
  const io::SafetensorsFile bfl(fixture_path(family + "/bfl.safetensors"));
  io::NamedTensors out;
  for (const std::string& name : bfl.names()) edit(name, bfl.get(name), out);
  const std::string path = test::fresh_output_dir("bfl_" + family + "_" + label) + "/" + label + ".safetensors";
  io::write_safetensors(path, out);
  return path;
}

std::string load_error(const std::string& family, const std::string& path) {
  try {
    auto model = test::fixture_architecture(family);
    load_weights(*model, open_checkpoint(*model, path));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("bfl checkpoint: Black Forest Labs' single file reads as the diffusers weights bit for bit",
          "[models][flux][checkpoint]") {
  for (const std::string family : {"flux", "flux2"}) DYNAMIC_SECTION(family) {
      const auto reference = test::fixture_family(family);
      auto model = test::fixture_architecture(family);
      const io::Checkpoint bfl = open_checkpoint(*model, fixture_path(family + "/bfl.safetensors"));
      CHECK(bfl.regrouped() == io::SafetensorsFile(fixture_path(family + "/bfl.safetensors")).names().size());
      load_weights(*model, bfl);
      CHECK(differing(*model, *reference).empty());
      test::check_fixture_case(*model, family, "case_0", test::fixture_fp32_ulps(family));
      // The diffusers layout is read as it is stored.
      CHECK(open_checkpoint(*model, fixture_path(family + "/weights.safetensors")).regrouped() == 0);

      // ComfyUI's copies: the same names under model.diffusion_model.
      const std::string comfy =
          edited_bfl(family, "comfy", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
            out.emplace_back("model.diffusion_model." + name, t);
          });
      auto from_comfy = test::fixture_architecture(family);
      load_weights(*from_comfy, open_checkpoint(*from_comfy, comfy));
      CHECK(differing(*from_comfy, *reference).empty());

      // Negative control: the final modulation stored in diffusers' order
      // loads (same shapes) but is read swapped, and is seen.
      const std::string unswapped =
          edited_bfl(family, "unswapped", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
            const bool modulation = name.rfind("final_layer.adaLN_modulation.1.", 0) == 0;
            out.emplace_back(name, modulation ? at::cat({t.chunk(2)[1], t.chunk(2)[0]}) : t);
          });
      auto from_unswapped = test::fixture_architecture(family);
      load_weights(*from_unswapped, open_checkpoint(*from_unswapped, unswapped));
      std::vector<std::string> modulation{"norm_out.linear.weight"};
      if (family == "flux") modulation.push_back("norm_out.linear.bias");  // FLUX.2's linears have none
      CHECK(differing(*from_unswapped, *reference) == modulation);

      const auto inspect = test::run_process(fmt::format("{} inspect {} --family {} --config {}", DITRL_BINARY,
                                                         fixture_path(family + "/bfl.safetensors"), family,
                                                         fixture_path(family + "/config.json")));
      INFO(inspect.output);
      CHECK(inspect.exit_code == 0);
      CHECK_THAT(inspect.output, Contains("stored tensors regrouped into"));
    }
}

TEST_CASE("bfl checkpoint: fused tensors that do not split are errors naming the file and tensor",
          "[models][flux][checkpoint]") {
  const std::string short_qkv =
      edited_bfl("flux", "short_qkv", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
        out.emplace_back(name, name == "double_blocks.1.txt_attn.qkv.weight" ? t.slice(0, 1) : t);
      });
  CHECK_THAT(load_error("flux", short_qkv), Contains(short_qkv) &&
                                                Contains("'double_blocks.1.txt_attn.qkv.weight' has 95 rows") &&
                                                Contains("multiple of 3"));
  const std::string short_linear1 =
      edited_bfl("flux", "short_linear1", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
        out.emplace_back(name, name == "single_blocks.0.linear1.weight" ? t.slice(0, 0, 96) : t);
      });
  CHECK_THAT(load_error("flux", short_linear1),
             Contains("'single_blocks.0.linear1.weight' has 96 rows") && Contains("width 32"));
  const std::string odd_modulation =
      edited_bfl("flux2", "odd_modulation", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
        out.emplace_back(name, name == "final_layer.adaLN_modulation.1.weight" ? t.slice(0, 1) : t);
      });
  CHECK_THAT(load_error("flux2", odd_modulation), Contains("(shift, scale) halves need an even count"));
  // A missing fused tensor is reported under the names the model reads.
  const std::string missing =
      edited_bfl("flux", "missing", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
        if (name != "double_blocks.0.img_attn.qkv.weight") out.emplace_back(name, t);
      });
  CHECK_THAT(load_error("flux", missing),
             Contains(missing) && Contains("missing (3)") && Contains("transformer_blocks.0.attn.to_q.weight"));
  // A tensor no rule names is reported under its own.
  const std::string extra =
      edited_bfl("flux2", "extra", [](const std::string& name, const at::Tensor& t, io::NamedTensors& out) {
        out.emplace_back(name, t);
        if (name == "img_in.weight") out.emplace_back("double_blocks.0.img_attn.lora_up.weight", t);
      });
  CHECK_THAT(load_error("flux2", extra), Contains("unexpected (1): double_blocks.0.img_attn.lora_up.weight"));
}
