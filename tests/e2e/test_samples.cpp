// Preview samples ([log] samples_every, app/samples.hpp) from real MPI runs:
// the quickstart's PNG grids and index, read back through libpng, the same
// prompts each time, training metrics bitwise those of a run without
// samples; a tiny Wan video run (sequence parallel over 2 ranks) as an
// animated WebP read back through libwebp; a family without published
// factors refused by name; with [log] decoder, a decoder module's pixels on
// image and video runs, and a module of the wrong kind refused by name.
#include <ditrl/io/png.hpp>
#include <ditrl/io/webp.hpp>

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kQuickstart = std::string(DITRL_SOURCE_DIR) + "/inputs/quickstart.toml";

std::vector<boost::json::object> index_lines(const std::string& out) {
  std::vector<boost::json::object> lines;
  std::istringstream in(test::read_file(out + "/samples/index.jsonl"));
  for (std::string line; std::getline(in, line);) lines.push_back(boost::json::parse(line).as_object());
  return lines;
}

// The series that do not measure time or memory, which differ run to run.
std::map<std::string, std::vector<double>> training_series(const io::MetricsTable& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, values] : m.series)
    if (name.rfind("perf/", 0) != 0) out[name] = values;
  return out;
}

// Names of the series whose values differ in any bit.
std::vector<std::string> differing(const std::map<std::string, std::vector<double>>& a,
                                   const std::map<std::string, std::vector<double>>& b) {
  std::vector<std::string> out;
  for (const auto& [name, values] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.size() != values.size() ||
        std::memcmp(values.data(), it->second.data(), values.size() * sizeof(double)) != 0)
      out.push_back(name);
  }
  if (a.size() != b.size()) out.push_back("(a different set of series)");
  return out;
}

}  // namespace

TEST_CASE("samples: the quickstart writes PNG grids of the same prompts and keeps its metrics bitwise",
          "[e2e][samples]") {
  const std::string run = " --set train.num_rollouts=3";
  const std::string on = test::fresh_output_dir("e2e_samples_on");
  const std::string off = test::fresh_output_dir("e2e_samples_off");
  const auto a = test::train(kQuickstart, on, 2, run + " --set log.samples_every=2 --set log.samples=3");
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  const auto b = test::train(kQuickstart, off, 2, run + " --set log.samples_every=0");
  REQUIRE(b.exit_code == 0);

  // Before the first rollout, every 2nd, and after the last.
  const std::vector<boost::json::object> lines = index_lines(on);
  REQUIRE(lines.size() == 3);
  const std::vector<int64_t> rollouts{0, 2, 3};
  std::vector<at::Tensor> grids;
  for (size_t i = 0; i < lines.size(); ++i) {
    const boost::json::object& l = lines[i];
    INFO(boost::json::serialize(l));
    CHECK(l.at("rollout").as_int64() == rollouts[i]);
    const std::string file = fmt::format("rollout-{:06d}.png", rollouts[i]);
    CHECK(l.at("file").as_string() == file);
    CHECK(l.at("source").as_string() == "latent_preview");
    CHECK(l.at("prompts") == lines[0].at("prompts"));  // the same prompts each time
    CHECK(l.at("prompt_index") == lines[0].at("prompt_index"));
    REQUIRE(l.at("prompts").as_array().size() == 3);
    REQUIRE(l.at("rewards").as_array().size() == 3);
    CHECK_THAT(std::string(l.at("prompts").as_array()[0].as_string()), Contains("synthetic prompt"));

    // 3 samples of an 8 x 8 latent (64 x 64 pixels) in a 2 x 2 grid; the 4th cell stays black.
    const io::PngImage png = io::read_png(on + "/samples/" + file);
    REQUIRE(png.rgb.sizes() == at::IntArrayRef({128, 128, 3}));
    CHECK(at::all(png.rgb.narrow(0, 64, 64).narrow(1, 64, 64) == 0).item<bool>());
    CHECK(at::any(png.rgb.narrow(0, 0, 64).narrow(1, 0, 64) != 0).item<bool>());
    CHECK(png.text.at("ditrl") == boost::json::serialize(l));
    CHECK_THAT(png.text.at("Description"), Contains("(reward "));
    grids.push_back(png.rgb);
  }
  // The pictures and rewards follow the weights: training changed both.
  CHECK_FALSE(at::equal(grids.front(), grids.back()));
  CHECK(lines.front().at("rewards") != lines.back().at("rewards"));
  // No temporary file is left beside them.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(on + "/samples")) {
    CHECK(e.path().string().find(".tmp.") == std::string::npos);
    ++files;
  }
  CHECK(files == 4);
  CHECK_FALSE(std::filesystem::exists(off + "/samples"));

  // The training's metrics are the very bits of the run without samples.
  const auto with = training_series(test::metrics_of(on)), without = training_series(test::metrics_of(off));
  REQUIRE(with.count("rollout/reward/raw_mean"));
  REQUIRE(with.count("train/loss"));
  CHECK(differing(with, without).empty());
  // Negative control: the comparison sees a one-ulp change in one value.
  auto nudged = without;
  double& v = nudged.at("train/loss").back();
  v = std::nextafter(v, 1e300);
  CHECK(differing(with, nudged) == std::vector<std::string>{"train/loss"});
}

TEST_CASE("samples: a tiny Wan video run writes an animated WebP of its samples side by side", "[e2e][samples]") {
  const std::string out = test::fresh_output_dir("e2e_samples_wan");
  const auto r = test::train(test::e2e_deck("wan_sequence_parallel.toml"), out, 2,
                             "--set parallel.sequence_parallel=2 --set rollout.frames=3 --set rollout.height=8 "
                             "--set rollout.width=8 --set train.num_rollouts=1 --set log.samples_every=1 "
                             "--set log.samples=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<boost::json::object> lines = index_lines(out);
  REQUIRE(lines.size() == 2);
  for (const boost::json::object& l : lines) {
    const std::string file(l.at("file").as_string());
    CHECK(file.substr(file.size() - 5) == ".webp");
    // 2 samples of 8 x 8 latents, 64 x 64 pixels each, side by side; one frame per latent frame.
    const io::WebpAnimation anim = io::read_animated_webp(out + "/samples/" + file);
    CHECK(anim.width == 128);
    CHECK(anim.height == 64);
    CHECK(anim.frames == 3);
  }
}

TEST_CASE("samples: a family with no published factors for its latent channels is refused naming the key",
          "[e2e][samples]") {
  const std::string out = test::fresh_output_dir("e2e_samples_ltx");
  const auto r =
      test::train(kQuickstart, out, 1, "--set model.family=ltx --set train.num_rollouts=1 --set log.samples_every=1");
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.output, Contains("log.samples_every") && Contains("16-channel") && Contains("ltx"));
}

namespace {

// A scripted decoder module (the shape tools/export_decoder.py's has): the
// first 3 latent channels as uint8 RGB, each latent cell a 2 x 2 block, so
// the grid's pixels can only have come from it.
std::string scripted_decoder(const std::string& dir, bool video, bool wrong_dtype = false) {
  const std::string path = dir + (wrong_dtype ? "/float_decoder.pt" : "/decoder.pt");
  const std::string layout = video ? "x[:, :3].permute(0, 2, 3, 4, 1)" : "x[:, :3].permute(0, 2, 3, 1)";
  const std::string up =
      video ? "y.repeat_interleave(2, 2).repeat_interleave(2, 3)" : "y.repeat_interleave(2, 1).repeat_interleave(2, 2)";
  std::ofstream(dir + "/make_decoder.py") << fmt::format(R"(
import sys, torch
class Decoder(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ({} * 40 + 128).round().clamp(0, 255)
        return {}.to({})
torch.jit.save(torch.jit.script(Decoder()), sys.argv[1])
)",
                                                         layout, up, wrong_dtype ? "torch.float32" : "torch.uint8");
  const test::ProcessResult made = test::run_process(fmt::format("{} {}/make_decoder.py {}", DITRL_PYTHON, dir, path));
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  return path;
}

// Every 2 x 2 block of an [H, W, 3] picture holds one colour.
bool in_blocks(const at::Tensor& rgb) {
  const at::Tensor corner = rgb.slice(0, 0, rgb.size(0), 2).slice(1, 0, rgb.size(1), 2);
  return at::equal(rgb, corner.repeat_interleave(2, 0).repeat_interleave(2, 1));
}

}  // namespace

TEST_CASE("samples: with log.decoder the grids are the decoder module's pixels on image and video runs",
          "[e2e][samples]") {
  const std::string out = test::fresh_output_dir("e2e_samples_decoder");
  const std::string decoder = scripted_decoder(out, false);
  const auto r = test::train(kQuickstart, out + "/run", 2,
                             "--set train.num_rollouts=1 --set log.samples_every=1 --set log.samples=3 "
                             "--set log.decoder=" +
                                 decoder);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::vector<boost::json::object> lines = index_lines(out + "/run");
  REQUIRE(lines.size() == 2);
  for (const boost::json::object& l : lines) {
    CHECK(l.at("source").as_string() == "decoder");
    // 3 samples of an 8 x 8 latent, 16 x 16 decoded pixels each, in a 2 x 2 grid (the latent preview's are 64 x 64).
    const io::PngImage png = io::read_png(out + "/run/samples/" + std::string(l.at("file").as_string()));
    REQUIRE(png.rgb.sizes() == at::IntArrayRef({32, 32, 3}));
    CHECK(in_blocks(png.rgb));
    CHECK(at::any(png.rgb.narrow(0, 0, 16).narrow(1, 0, 16) != 0).item<bool>());
  }
  // Negative control for in_blocks: a picture with one pixel changed.
  at::Tensor nudged = io::read_png(out + "/run/samples/rollout-000000.png").rgb.clone();
  nudged[0][1][0] = static_cast<uint8_t>(nudged[0][0][0].item<uint8_t>() ^ 1);
  CHECK_FALSE(in_blocks(nudged));

  // Video: each decoded frame is a frame of the animation.
  const std::string video_decoder = scripted_decoder(out, true);
  const auto v = test::train(test::e2e_deck("wan_sequence_parallel.toml"), out + "/wan", 2,
                             "--set parallel.sequence_parallel=2 --set rollout.frames=3 --set rollout.height=8 "
                             "--set rollout.width=8 --set train.num_rollouts=1 --set log.samples_every=1 "
                             "--set log.samples=2 --set log.decoder=" +
                                 video_decoder);
  INFO(v.output);
  REQUIRE(v.exit_code == 0);
  const io::WebpAnimation anim = io::read_animated_webp(out + "/wan/samples/rollout-000001.webp");
  CHECK(anim.width == 32);  // 2 samples of 16 x 16 side by side
  CHECK(anim.height == 16);
  CHECK(anim.frames == 3);

  // A module that does not return uint8 RGB is a named error.
  const auto bad = test::train(
      kQuickstart, out + "/bad", 1,
      "--set train.num_rollouts=1 --set log.samples_every=1 --set log.decoder=" + scripted_decoder(out, false, true));
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("log.decoder: decoder module") && Contains("expected uint8"));
}
