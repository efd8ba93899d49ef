#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/reference.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "model_fixtures.hpp"
#include "process.hpp"

#include <filesystem>
#include <limits>
#include <set>

using namespace ditrl;
using Catch::Matchers::Contains;
using test::fixture_path;
using test::run_process;

namespace {

std::string forward_command(const std::string& inputs, const std::string& out, const std::string& extra = "") {
  return fmt::format("{} forward --family sd3 --config {} --weights {} --inputs {} --out {} {}", DITRL_BINARY,
                     fixture_path("sd3/config.json"), fixture_path("sd3/weights.safetensors"), inputs, out, extra);
}

}  // namespace

TEST_CASE("cli: ditrl forward writes what the in-process reference run computes", "[app][cli]") {
  const std::string dir = test::fresh_output_dir("cli_forward");
  const std::string inputs = fixture_path("sd3/case_1.safetensors");
  const auto result = run_process(forward_command(inputs, dir + "/out.safetensors", "--intermediates --threads 1"));
  INFO(result.output);
  REQUIRE(result.exit_code == 0);
  CHECK_THAT(result.output, Contains("output  Float  [2, 4, 8, 12]  max |ditrl - stored| ="));
  const io::SafetensorsFile out(dir + "/out.safetensors");
  const models::ReferenceCase c = models::load_reference_case(inputs);
  std::set<std::string> stored, written;
  for (const auto& [name, t] : c.stored) stored.insert(name);
  for (const std::string& name : out.names()) written.insert(name);
  CHECK(written == stored);  // `output` and every intermediate, under the fixture's names
  CHECK(out.metadata().at("family") == "sd3");
  auto family = test::fixture_family("sd3");
  // The process ran on one thread: so does the reference here (MKL's non-Intel
  // paths split a GEMM's sums by thread count).
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto expected = models::run_reference_case(*family, c, true);
  at::set_num_threads(threads);
  for (const auto& [name, tensor] : expected) CHECK(at::equal(out.get(name), tensor));

  const auto bf16 = run_process(
      forward_command(fixture_path("sd3/case_bf16.safetensors"), dir + "/bf16.safetensors", "--dtype bf16"));
  INFO(bf16.output);
  REQUIRE(bf16.exit_code == 0);
  const at::Tensor got = io::SafetensorsFile(dir + "/bf16.safetensors").get("output");
  CHECK(got.scalar_type() == at::kBFloat16);
  CHECK(test::max_abs_diff(got, io::SafetensorsFile(fixture_path("sd3/case_bf16.safetensors")).get("output")) <=
        1.0 / 32);

  const auto mismatch = run_process(forward_command(inputs, dir + "/x.safetensors", "--dtype bf16"));
  CHECK(mismatch.exit_code != 0);
  CHECK_THAT(mismatch.output, Contains("case_1.safetensors") &&
                                  Contains("'hidden_states' is fp32 but the patch embedding weights are bf16"));
  const auto missing = run_process(forward_command(dir + "/absent.safetensors", dir + "/x.safetensors"));
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.output, Contains("absent.safetensors"));
}

TEST_CASE("cli: ditrl inspect lists tensors and validates them against a family", "[app][cli]") {
  const std::string weights = fixture_path("sd3/weights.safetensors");
  const auto listed = run_process(fmt::format("{} inspect {}", DITRL_BINARY, weights));
  REQUIRE(listed.exit_code == 0);
  CHECK_THAT(listed.output,
             Contains("pos_embed.pos_embed  F32  [1, 256, 64]  65536") && Contains("# metadata format = pt"));
  const auto valid = run_process(
      fmt::format("{} inspect {} --family sd3 --config {}", DITRL_BINARY, weights, fixture_path("sd3/config.json")));
  INFO(valid.output);
  CHECK(valid.exit_code == 0);
  CHECK_THAT(valid.output, Contains("# matches family sd3"));
  const auto wrong = run_process(fmt::format("{} inspect {} --family sd3 --preset sd3.5-large", DITRL_BINARY, weights));
  CHECK(wrong.exit_code != 0);
  CHECK_THAT(wrong.output, Contains("does not match the model") && Contains("missing (") && Contains("wrong shape (") &&
                               Contains(weights));
  const auto unknown = run_process(fmt::format("{} inspect {} --family sdxl", DITRL_BINARY, weights));
  CHECK_THAT(unknown.output, Contains("unknown model family 'sdxl'"));
  const std::string bad = test::fresh_output_dir("cli_inspect") + "/bad.safetensors";
  std::ofstream(bad) << "not a safetensors file at all";
  const auto hostile = run_process(fmt::format("{} inspect {}", DITRL_BINARY, bad));
  CHECK(hostile.exit_code != 0);
  CHECK_THAT(hostile.output, Contains(bad) && Contains("header length"));
}

TEST_CASE("cli: ditrl forward and inspect fail on weights holding NaN or Inf - naming the tensors", "[app][cli]") {
  const std::string dir = test::fresh_output_dir("cli_nonfinite");
  const io::SafetensorsFile fixture(fixture_path("sd3/weights.safetensors"));
  io::NamedTensors tensors;
  for (const std::string& name : fixture.names()) {
    at::Tensor t = fixture.get(name).clone();
    if (name == "pos_embed.pos_embed") {
      t.view({-1})[3] = std::numeric_limits<float>::quiet_NaN();
      t.view({-1})[5] = std::numeric_limits<float>::infinity();
    }
    tensors.emplace_back(name, t);
  }
  const std::string weights = dir + "/nan.safetensors";
  io::write_safetensors(weights, tensors, {});

  const auto inspected = run_process(fmt::format("{} inspect {}", DITRL_BINARY, weights));
  CHECK(inspected.exit_code != 0);
  CHECK_THAT(inspected.output,
             Contains("pos_embed.pos_embed  F32  [1, 256, 64]  65536  NON-FINITE: 1 NaN, 1 Inf") &&
                 Contains("1 tensor(s) hold non-finite values: pos_embed.pos_embed (1 NaN, 1 Inf of 16384)"));
  CHECK(run_process(fmt::format("{} inspect {} --no-values", DITRL_BINARY, weights)).exit_code == 0);

  const auto forwarded = run_process(
      fmt::format("{} forward --family sd3 --config {} --weights {} --inputs {} --out {}/o.safetensors", DITRL_BINARY,
                  fixture_path("sd3/config.json"), weights, fixture_path("sd3/case_1.safetensors"), dir));
  CHECK(forwarded.exit_code != 0);
  CHECK_THAT(forwarded.output, Contains(weights + ": 1 weight tensor(s) hold non-finite values: pos_embed.pos_embed"));
  CHECK_FALSE(std::filesystem::exists(dir + "/o.safetensors"));
}

TEST_CASE("cli: ditrl forward on finite weights that overflow names the first non-finite tensor - writes nothing",
          "[app][cli]") {
  const std::string dir = test::fresh_output_dir("cli_overflow");
  const io::SafetensorsFile fixture(fixture_path("sd3/weights.safetensors"));
  io::NamedTensors tensors;
  // Finite (fp32 reaches 3.4e38), but the forward's products overflow.
  for (const std::string& name : fixture.names()) tensors.emplace_back(name, at::full_like(fixture.get(name), 1e36));
  const std::string weights = dir + "/huge.safetensors";
  io::write_safetensors(weights, tensors, {});
  const std::string inputs = fixture_path("sd3/case_1.safetensors");
  const auto r =
      run_process(fmt::format("{} forward --family sd3 --config {} --weights {} --inputs {} --out {}/o.safetensors",
                              DITRL_BINARY, fixture_path("sd3/config.json"), weights, inputs, dir));
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains(inputs + ": the forward's outputs hold non-finite values: output (") &&
                           Contains("the first recorded tensor that does: ") && !Contains("(none recorded)"));
  CHECK_FALSE(std::filesystem::exists(dir + "/o.safetensors"));
  // Negative control: the fixture's own weights run through with exit 0.
  CHECK(run_process(forward_command(inputs, dir + "/ok.safetensors")).exit_code == 0);
}

TEST_CASE("cli: ditrl forward --checkpoint / --lora refuse what does not fit / naming it", "[app][cli]") {
  const std::string dir = test::fresh_output_dir("cli_forward_sources");
  const std::string inputs = fixture_path("sd3/case_0.safetensors");
  const auto neither =
      run_process(fmt::format("{} forward --family sd3 --inputs {} --out {}/o.safetensors", DITRL_BINARY, inputs, dir));
  CHECK(neither.exit_code != 0);
  CHECK_THAT(neither.output, Contains("forward needs --family and --weights, or --checkpoint"));
  const auto both =
      run_process(fmt::format("{} forward --checkpoint {}/step-1.h5 --weights {} --inputs {} --out "
                              "{}/o.safetensors",
                              DITRL_BINARY, dir, fixture_path("sd3/weights.safetensors"), inputs, dir));
  CHECK(both.exit_code != 0);
  CHECK_THAT(both.output, Contains("brings its own model"));
  const auto missing = run_process(forward_command(inputs, dir + "/o.safetensors", "--lora " + dir + "/nope"));
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.output, Contains("LoRA adapter " + dir + "/nope: no such file or folder"));
  // An adapter for modules the model does not have.
  io::write_safetensors(dir + "/alien.safetensors", {{"transformer.blocks.0.nope.lora_A.weight", at::zeros({2, 4})},
                                                     {"transformer.blocks.0.nope.lora_B.weight", at::zeros({4, 2})}});
  const auto alien =
      run_process(forward_command(inputs, dir + "/o.safetensors", "--lora " + dir + "/alien.safetensors"));
  CHECK(alien.exit_code != 0);
  CHECK_THAT(alien.output, Contains("blocks.0.nope (not a linear layer of the model)"));
  CHECK_FALSE(std::filesystem::exists(dir + "/o.safetensors"));
}
