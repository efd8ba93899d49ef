// `ditrl export` streams the full weights tensor by tensor from a sliced
// model (app::StreamedCheckpointModel): its shards hold exactly what the
// whole model in memory (app::load_checkpoint_model, the path `ditrl forward
// --checkpoint` keeps) exports, and the safetensors package reads them.
#include <ditrl/app/checkpoint_model.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/embeddings.hpp>
#include <ditrl/models/lora.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <filesystem>
#include <fstream>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

// Reads DIR's index and every shard it names with safetensors.torch and
// compares each tensor with REF (one file): same names, dtypes, shapes and
// values. Prints one line per checked folder.
constexpr const char* kReadExport = R"PY(
import json, os, sys
import torch
from safetensors.torch import load_file
folder, ref_path = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(folder, "diffusion_pytorch_model.safetensors.index.json")))
shards = sorted(set(index["weight_map"].values()))
got = {}
for shard in shards:
    for name, t in load_file(os.path.join(folder, shard)).items():
        assert index["weight_map"][name] == shard, (name, shard)
        got[name] = t
ref = load_file(ref_path)
assert set(got) == set(ref), sorted(set(got) ^ set(ref))
total = sum(t.numel() * t.element_size() for t in got.values())
assert index["metadata"]["total_size"] == total, (index["metadata"]["total_size"], total)
for name, t in ref.items():
    assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
    assert torch.equal(got[name], t), name
print(f"ok {folder}: {len(got)} tensors in {len(shards)} shards equal the whole model's export")
)PY";

// What the whole model in memory exports for one part, cast as the export casts.
io::NamedTensors whole(io::NamedTensors tensors, c10::ScalarType dtype) {
  for (auto& [name, t] : tensors)
    if (t.is_floating_point()) t = t.to(dtype).contiguous();
  return tensors;
}

// The streamed folder against `expected`: bitwise in C++ (io::Checkpoint over
// the index) and through the safetensors package.
void check_folder(const std::string& folder, const io::NamedTensors& expected, const std::string& work) {
  INFO(folder);
  io::Checkpoint exported(folder + "/diffusion_pytorch_model.safetensors.index.json");
  CHECK(exported.files().size() > 1);
  std::vector<std::string> names;
  for (const auto& [name, t] : expected) {
    names.push_back(name);
    INFO(name);
    REQUIRE(exported.contains(name));
    CHECK(exported.get(name).scalar_type() == t.scalar_type());
    CHECK(at::equal(exported.get(name), t));
  }
  std::sort(names.begin(), names.end());
  CHECK(exported.names() == names);
  const std::string ref = work + "/reference.safetensors", script = work + "/read_export.py";
  io::write_safetensors(ref, expected);
  std::ofstream(script) << kReadExport;
  const auto r = test::run_process(std::string(DITRL_PYTHON) + " " + script + " " + folder + " " + ref);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("equal the whole model's export"));
}

}  // namespace

TEST_CASE("export: streamed shards equal the whole model's export / full fine-tune / LoRA merged / two experts",
          "[e2e][export]") {
  const std::string deck = test::e2e_deck("tiny_grpo.toml");
  SECTION("a full fine-tune, fp32, sharded above 100KB") {
    const std::string out = test::fresh_output_dir("e2e_export_streamed_full");
    REQUIRE(test::train(deck, out, 2, "--set train.num_rollouts=1").exit_code == 0);
    const std::string ckpt = out + "/checkpoints/step-1.h5";
    const auto r = test::ditrl("export " + ckpt + " --out " + out + "/export --max-shard-size 100KB");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const app::CheckpointModel m = app::load_checkpoint_model(ckpt);
    check_folder(out + "/export", whole(models::state_tensors(*m.family), at::kFloat), out);
  }
  SECTION("a LoRA run merged, bf16, sharded above 50KB") {
    const std::string out = test::fresh_output_dir("e2e_export_streamed_lora");
    REQUIRE(test::train(deck, out, 2,
                        "--set train.num_rollouts=1 --set model.lora.enabled=true --set model.lora.rank=4 "
                        "--set model.lora.alpha=6")
                .exit_code == 0);
    const std::string ckpt = out + "/checkpoints/step-1.h5";
    const auto r =
        test::ditrl("export " + ckpt + " --out " + out + "/export --merged --dtype bf16 --max-shard-size 50KB");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const app::CheckpointModel m = app::load_checkpoint_model(ckpt);
    check_folder(out + "/export/merged", whole(models::merged_state(*m.family), at::kBFloat16), out);
    // Training held only the deck grid's crop of SD3's pos_embed; the export
    // writes the whole (pos_embed_max_size^2, D) table, as computed.
    const io::Checkpoint merged(out + "/export/merged/diffusion_pytorch_model.safetensors.index.json");
    CHECK(merged.info("pos_embed.pos_embed").shape == std::vector<int64_t>{1, 144, 64});
    CHECK(at::equal(merged.get("pos_embed.pos_embed"),
                    models::sincos_pos_embed_2d(64, 12, 8.0, 1.0).unsqueeze(0).to(at::kBFloat16)));
  }
  SECTION("Wan2.2 A14B merged: each expert's folder, the base drawn expert by expert") {
    const std::string out = test::fresh_output_dir("e2e_export_streamed_a14b");
    const std::string a14b = std::string(DITRL_SOURCE_DIR) + "/tests/standards/proxy_wan22_grpo.toml";
    REQUIRE(test::train(a14b, out, 2, "--set train.num_rollouts=1").exit_code == 0);
    const std::string ckpt = out + "/checkpoints/step-1.h5";
    const auto r = test::ditrl("export " + ckpt + " --out " + out + "/export --merged --max-shard-size 100KB");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const app::CheckpointModel m = app::load_checkpoint_model(ckpt);
    const auto experts = m.family->expert_modules();
    REQUIRE(experts.size() == 2);
    check_folder(out + "/export/merged/transformer", whole(models::merged_state(*experts[0]), at::kFloat), out);
    check_folder(out + "/export/merged/transformer_2", whole(models::merged_state(*experts[1]), at::kFloat), out);
  }
}
