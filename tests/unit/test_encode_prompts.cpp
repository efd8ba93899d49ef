#include <ditrl/io/h5.hpp>
#include <ditrl/io/sha256.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rollout/prompts.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <fstream>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

// A tiny scripted encoder with the interface encode-prompts documents, its
// expected outputs for the prompts below (computed by PyTorch), and a
// broken encoder whose pooled output has the wrong width.
const char* kMakeEncoders = R"(
import sys, torch, h5py
from typing import Dict
class Encoder(torch.nn.Module):
    identity: str
    def __init__(self, pooled):
        super().__init__()
        torch.manual_seed(0)
        self.identity = "tiny-test-encoder v1"
        self.embed = torch.nn.Embedding(100, 48)
        self.pool = torch.nn.Linear(48, pooled)
    def forward(self, tokens: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        return {"encoder_hidden_states": self.embed(tokens["t5"]),
                "pooled_projections": self.pool(self.embed(tokens["clip"]).mean(1))}
good = torch.jit.script(Encoder(32))
good.save(sys.argv[1] + "/encoder.pt")
torch.jit.script(Encoder(31)).save(sys.argv[1] + "/bad_encoder.pt")
t5 = torch.tensor([[(7 * i + j) % 100 for j in range(8)] for i in range(5)])
clip = torch.tensor([[(3 * i + j) % 100 for j in range(4)] for i in range(5)])
with torch.no_grad():
    out = good({"t5": t5, "clip": clip})
with h5py.File(sys.argv[1] + "/expected.h5", "w") as f:
    for k, v in out.items():
        f[k] = v.numpy()
)";

std::string token_list(int64_t first, int64_t step, int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < n; ++j) ids.push_back((first * step + j) % 100);
  return fmt::format("[{}]", fmt::join(ids, ", "));
}

// Prompts 0..3 and, as the 5th line, a negative prompt with row 4's tokens.
void write_prompts(const std::string& path) {
  std::ofstream out(path);
  for (int64_t i = 0; i < 5; ++i)
    out << fmt::format(R"({{"prompt": "prompt {}", "tokens": {{"t5": {}, "clip": {}}}{}}})", i, token_list(i, 7, 8),
                       token_list(i, 3, 4), i == 4 ? R"(, "negative": true)" : "")
        << "\n";
}

std::string encode_command(const std::string& dir, const std::string& encoder, const std::string& prompts,
                           const std::string& extra = "--family sd3 --preset tiny") {
  return fmt::format("{} encode-prompts --encoder {}/{} --prompts {} --out {}/prompts.h5 --batch 3 {}", DITRL_BINARY,
                     dir, encoder, prompts, dir, extra);
}

}  // namespace

TEST_CASE("encode-prompts: a TorchScript encoder over JSONL writes the dataset the trainer reads", "[app][prompts]") {
  const std::string dir = test::fresh_output_dir("encode_prompts");
  const std::string script = dir + "/make.py";
  std::ofstream(script) << kMakeEncoders;
  const auto made = test::run_process(std::string(DITRL_PYTHON) + " " + script + " " + dir);
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  write_prompts(dir + "/prompts.jsonl");

  const auto r = test::run_process(encode_command(dir, "encoder.pt", dir + "/prompts.jsonl"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("4 prompts and a negative prompt"));

  models::FamilyOptions o;
  o.family = "sd3";
  o.device = c10::kMeta;
  auto source = rollout::open_prompt_dataset(dir + "/prompts.h5", models::create_family(o)->cond_spec());
  REQUIRE(source->size() == 4);
  const models::Cond cond = source->fetch({0, 1, 2, 3});
  const models::Cond negative = source->negative(1);
  auto expected = io::h5::File::open(dir + "/expected.h5");
  for (const char* name : {"encoder_hidden_states", "pooled_projections"}) {
    INFO(name);
    const at::Tensor all = expected.open_dataset(name).read();
    CHECK(at::allclose(cond.at(name), all.narrow(0, 0, 4), 1e-6, 1e-6));
    CHECK(at::allclose(negative.at(name), all.narrow(0, 4, 1), 1e-6, 1e-6));
  }
  CHECK(source->text(2) == "prompt 2");
  auto file = io::h5::File::open(dir + "/prompts.h5");
  CHECK(file.string_attr("encoder_identity") == "tiny-test-encoder v1");
  CHECK(file.string_attr("encoder_sha256") == io::sha256_file(dir + "/encoder.pt"));
  const auto sum = test::run_process("sha256sum " + dir + "/encoder.pt");
  CHECK_THAT(sum.output, Contains(file.string_attr("encoder_sha256")));
  CHECK(file.string_attr("negative_prompt") == "prompt 4");
}

TEST_CASE("encode-prompts: bad prompt files and encoders are named and write nothing", "[app][prompts]") {
  const std::string dir = test::fresh_output_dir("encode_prompts_bad");
  const std::string script = dir + "/make.py";
  std::ofstream(script) << kMakeEncoders;
  REQUIRE(test::run_process(std::string(DITRL_PYTHON) + " " + script + " " + dir).exit_code == 0);
  write_prompts(dir + "/good.jsonl");

  auto expect_error = [&](const std::string& command, const std::string& message) {
    const auto r = test::run_process(command);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Contains(message));
    CHECK_FALSE(std::filesystem::exists(dir + "/prompts.h5"));
  };
  expect_error(encode_command(dir, "bad_encoder.pt", dir + "/good.jsonl"),
               "output 'pooled_projections' is [B, 31] per batch, the family expects [B, 32]");
  expect_error(encode_command(dir, "missing.pt", dir + "/good.jsonl"), "missing.pt: no such file");

  std::ofstream(dir + "/not_json.jsonl") << R"({"prompt": "a", "tokens": {"t5": [1]}})"
                                         << "\n{oops\n";
  expect_error(encode_command(dir, "encoder.pt", dir + "/not_json.jsonl"), "not_json.jsonl:2: not valid JSON");
  std::ofstream(dir + "/ragged.jsonl") << R"({"prompt": "a", "tokens": {"t5": [1, 2]}})"
                                       << "\n"
                                       << R"({"prompt": "b", "tokens": {"t5": [1]}})"
                                       << "\n";
  expect_error(encode_command(dir, "encoder.pt", dir + "/ragged.jsonl"), "has 1 tokens.t5 ids, the first prompt 2");
  std::ofstream(dir + "/no_tokens.jsonl") << R"({"prompt": "a"})"
                                          << "\n";
  expect_error(encode_command(dir, "encoder.pt", dir + "/no_tokens.jsonl"), "no_tokens.jsonl:1: expected \"tokens\"");
  std::ofstream(dir + "/text_id.jsonl") << R"({"prompt": "a", "tokens": {"t5": ["x"]}})"
                                        << "\n";
  expect_error(encode_command(dir, "encoder.pt", dir + "/text_id.jsonl"), "not an integer token id");
}
