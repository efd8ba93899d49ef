// tools/export_text_encoder.py and tools/export_reward.py: their argument
// checks, and their --tiny paths (the same wrapping and tracing code as the
// real export, around seeded tiny models) loaded by ditrl: encoders through
// `ditrl encode-prompts`, rewards through the TorchScript reward.
#include <ditrl/io/h5.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/reward.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <fstream>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kTools = std::string(DITRL_SOURCE_DIR) + "/tools/";

test::ProcessResult python(const std::string& args) {
  return test::run_process(std::string(DITRL_PYTHON) + " " + args);
}

// One Python process exports every tiny module and scores fixed latents with
// the tiny rewards, so the C++ side can be compared with PyTorch's own call.
const char* kExportAll = R"(
import sys, torch
sys.path.insert(0, sys.argv[1])
import export_text_encoder, export_reward
d = sys.argv[2]
for f in ("sd3", "qwen_image", "wan", "flux", "flux2"):
    export_text_encoder.main(["export", "--family", f, "--tiny", "--out", f"{d}/enc_{f}.pt"])
with open(f"{d}/prompts.txt", "w") as p:
    p.write("a red cube\na cat\nsunset\n")
for f, shape in (("sd3", (3, 16, 8, 8)), ("wan", (3, 16, 2, 8, 8))):
    export_reward.main(["--family", f, "--tiny", "--prompts", f"{d}/prompts.txt", "--out", f"{d}/rew_{f}.pt"])
    x = torch.linspace(-1, 1, torch.Size(shape).numel()).view(shape)
    r = torch.jit.load(f"{d}/rew_{f}.pt")(x, torch.tensor([2, 0, 1]))
    with open(f"{d}/rew_{f}.txt", "w") as out:
        out.write(" ".join(repr(v) for v in r.tolist()))
)";

// JSONL with token ids of the tiny encoder's tokenizer names and lengths.
void write_prompts(const std::string& path, const std::string& family) {
  const std::map<std::string, std::string> tokens = {
      {"sd3", R"({"clip_l": [1, 2, 3, 4], "t5": [5, 6, 7, 8]})"},
      {"qwen_image", R"({"qwen": [1, 2, 3, 4, 5, 6, 7, 8]})"},
      {"wan", R"({"umt5": [9, 8, 7, 6, 5, 4, 3, 2]})"},
      {"flux", R"({"clip_l": [1, 2, 3, 4], "t5": [8, 7, 6, 5, 4, 3, 2, 1]})"},
      {"flux2", R"({"qwen3": [3, 1, 4, 1, 5, 9, 2, 6]})"}};
  std::ofstream out(path);
  out << R"({"prompt": "a red cube", "tokens": )" << tokens.at(family) << "}\n"
      << R"({"prompt": "a cat", "tokens": )" << tokens.at(family) << "}\n";
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> v;
  for (double x; in >> x;) v.push_back(static_cast<float>(x));
  return v;
}

}  // namespace

TEST_CASE("export tools: --help documents the subcommands and bad arguments are refused", "[tools]") {
  const auto help = python(kTools + "export_text_encoder.py --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.output, Contains("tokenize") && Contains("export") && Contains("tests/interop/export_tools.py"));
  const auto neither = python(kTools + "export_text_encoder.py export --family sd3 --out /dev/null");
  CHECK(neither.exit_code != 0);
  CHECK_THAT(neither.output, Contains("exactly one of --model MODEL_DIR or --tiny"));
  const auto reward = python(kTools + "export_reward.py --family sd3 --prompts /dev/null --out /dev/null");
  CHECK(reward.exit_code != 0);
  CHECK_THAT(reward.output, Contains("exactly one of --vae"));
}

TEST_CASE("export tools: tiny exported encoders and rewards load in ditrl with the documented interface",
          "[tools][prompts][reward]") {
  const std::string dir = test::fresh_output_dir("export_tools");
  const std::string script = dir + "/export_all.py";
  std::ofstream(script) << kExportAll;
  const auto made = python(fmt::format("{} {} {}", script, kTools, dir));
  INFO(made.output);
  REQUIRE(made.exit_code == 0);

  for (const std::string family : {"sd3", "qwen_image", "wan", "flux", "flux2"}) {
    INFO(family);
    const std::string jsonl = dir + "/" + family + ".jsonl", h5 = dir + "/" + family + ".h5";
    write_prompts(jsonl, family);
    const auto r =
        test::run_process(fmt::format("{} encode-prompts --encoder {}/enc_{}.pt --prompts {} --out {} "
                                      "--family {} --preset tiny",
                                      DITRL_BINARY, dir, family, jsonl, h5, family));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    models::FamilyOptions o;
    o.family = family;
    o.preset = "tiny";
    o.device = c10::kMeta;
    const auto dataset = rollout::open_prompt_dataset(h5, models::create_family(o)->cond_spec());
    CHECK(dataset->size() == 2);
    CHECK_THAT(io::h5::File::open(h5).string_attr("encoder_identity"),
               Contains("tiny-" + family) && Contains("ditrl-export-text-encoder"));
  }

  for (const auto& [family, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"sd3", {3, 16, 8, 8}}, {"wan", {3, 16, 2, 8, 8}}}) {
    INFO(family);
    rollout::RewardOptions options;
    options.kind = rollout::RewardKind::TorchScript;
    options.module = dir + "/rew_" + family + ".pt";
    const auto reward = rollout::make_reward(options);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const at::Tensor x = at::linspace(-1, 1, numel).view(shape);
    const at::Tensor scores = reward->score(x, at::tensor({2, 0, 1}, at::kLong), {});
    const std::vector<float> expected = read_floats(dir + "/rew_" + family + ".txt");
    REQUIRE(expected.size() == 3);
    for (int64_t i = 0; i < 3; ++i) CHECK(scores[i].item<float>() == Approx(expected[i]).epsilon(1e-6));
    // The prompt index selects the precomputed text embedding.
    CHECK(reward->score(x, at::tensor({0, 0, 0}, at::kLong), {})[0].item<float>() != scores[0].item<float>());
    CHECK_THROWS_WITH(reward->score(x, at::tensor({0, 1, 3}, at::kLong), {}), Contains("prompt_index out of range"));
  }
}
