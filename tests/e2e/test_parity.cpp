// Train/rollout parity as users check it: `mpiexec -np 2 ditrl train` with
// [debug] dump = true, then `ditrl align`. At a run's first optimizer step the
// training forward of every dumped (sample, step) reproduces the rollout
// forward bit for bit, in fp32 and in bf16 forward precision (fp32 masters);
// and align does see the difference between a bf16 and an fp32 run.
//
// One line per family at the bottom (deck + the tensor where a bf16 run
// first departs from an fp32 run).
#include <ditrl/io/dump_alignment.hpp>
#include <ditrl/io/tensor_dump.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <algorithm>

using namespace ditrl;
namespace json = boost::json;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

// Samples 0 (rank 0, row 0 of its micro-group) and 5 (rank 1, row 1).
const std::vector<int64_t> kDumpedSamples = {0, 5};

std::string dump_file(const std::string& out, int rank) {
  return out + "/debug/dump-rank" + std::to_string(rank) + ".h5";
}

std::string dumped_run(const std::string& family, const std::string& deck, const std::string& forward) {
  const std::string out = test::fresh_output_dir("parity_" + family + "_" + forward);
  const auto r = test::train(test::e2e_deck(deck), out, 2,
                             "--set train.num_rollouts=1 --set precision.forward=" + forward +
                                 " --set debug.dump=true --set 'debug.samples=[0,5]'");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return out;
}

json::object align_json(const std::string& a, const std::string& b, const std::string& sides) {
  const auto r = test::ditrl("align " + a + " " + b + " --sides " + sides + " --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return json::parse(r.output).as_object();
}

std::vector<std::string> keys_of(const std::string& file) {
  const io::h5::File f = io::h5::File::open(file);
  std::vector<std::string> keys;
  for (const io::DumpEntry& e : io::list_tensor_dump(f, "rollout"))
    if (std::find(keys.begin(), keys.end(), e.key) == keys.end()) keys.push_back(e.key);
  return keys;
}

// The record points every family provides (docs/families.md naming).
void check_record_points(const std::string& file, const std::string& attention) {
  const io::h5::File f = io::h5::File::open(file);
  std::vector<std::string> paths;
  for (const io::DumpEntry& e : io::list_tensor_dump(f, "rollout")) paths.push_back(e.path);
  auto any = [&paths](const std::string& suffix) {
    return std::any_of(paths.begin(), paths.end(), [&](const std::string& p) {
      return p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0;
    });
  };
  for (const char* suffix :
       {"sde/mean", "sde/std", "sde/log_prob", "proj_out/out0", "/in0", ".norm1/out0", attention.c_str(), ".0/out0"}) {
    INFO(file << " records a tensor ending in " << suffix);
    CHECK(any(suffix));
  }
}

// Rollout vs training forward of one run: every pair bit-exact.
void check_rollout_train_parity(const std::string& out, int64_t pairs, size_t keys_per_rank,
                                const std::string& attention) {
  const io::MetricsTable m = test::metrics_of(out);
  CHECK(m.series.at("train/log_prob_mean_abs_diff")[0] == 0.0);
  CHECK(m.series.at("train/model_output_max_abs_diff")[0] == 0.0);
  for (int rank : {0, 1}) {
    const std::string file = dump_file(out, rank);
    INFO(file);
    const std::vector<std::string> keys = keys_of(file);
    CHECK(keys.size() == keys_per_rank);  // the rollout's SDE steps of the rank's dumped sample
    for (const std::string& key : keys)
      CHECK_THAT(key, StartsWith("r0_s" + std::to_string(kDumpedSamples[rank]) + "_t"));
    check_record_points(file, attention);
    const json::object r = align_json(file, file, "rollout,train");
    INFO(json::serialize(r));
    CHECK(r.at("pairs").as_int64() == pairs);
    CHECK(r.at("bit_exact") == r.at("pairs"));
    CHECK(r.at("over_threshold").as_int64() == 0);
    CHECK(r.at("peak_rel").as_double() == 0.0);
    CHECK(r.at("first_divergence").is_null());
    CHECK(r.at("only_a").as_array().empty());
    CHECK(r.at("only_b").as_array().empty());
  }
}

// What differs between families: the deck, the first tensor a bf16 run
// changes, SDE steps per sample, the attention output's record name, and
// whether the time embedding's input stays fp32 in a bf16 forward (Qwen-Image
// casts sigma to the hidden dtype before recording it).
struct FamilyParity {
  std::string family, deck, first_divergence;
  int64_t pairs;  // record points x SDE steps of one rank's dumped sample (measured, benchmarks/results/parity.md)
  size_t keys_per_rank = 2;
  std::string attention = ".attn/out0";
  bool time_input_exact = true;
  size_t time_inputs_per_key = 1;  // LTX records its video and prompt AdaLN inputs
};

void check_family_parity(const FamilyParity& p) {
  const std::string &family = p.family, &deck = p.deck, &first_divergence = p.first_divergence;
  const std::string fp32 = dumped_run(family, deck, "fp32");
  const std::string bf16 = dumped_run(family, deck, "bf16");
  {
    INFO("forward fp32");
    check_rollout_train_parity(fp32, p.pairs, p.keys_per_rank, p.attention);
  }
  {
    INFO("forward bf16, fp32 masters");
    check_rollout_train_parity(bf16, p.pairs, p.keys_per_rank, p.attention);
  }

  // Negative control: the bf16 run against the fp32 run, rollout sides.
  const json::object r = align_json(dump_file(bf16, 0), dump_file(fp32, 0), "rollout,rollout");
  INFO(json::serialize(r));
  CHECK(r.at("pairs").as_int64() == p.pairs);
  CHECK(r.at("bit_exact").as_int64() < r.at("pairs").as_int64());
  CHECK(r.at("only_a").as_array().empty());
  REQUIRE(r.at("first_divergence").is_object());
  const json::object& first = r.at("first_divergence").as_object();
  CHECK_THAT(std::string(first.at("name").as_string()), StartsWith("r0_s0_t") && EndsWith("/" + first_divergence));
  CHECK(first.at("rel").as_double() > 0);
  CHECK(r.at("peak_rel").is_double());

  // The time embedding's input is carried exactly in both precisions (where it is recorded before any cast).
  const io::h5::File a = io::h5::File::open(dump_file(bf16, 0)), b = io::h5::File::open(dump_file(fp32, 0));
  int64_t time_inputs = 0;
  for (const io::DumpEntry& e : io::list_tensor_dump(a, "rollout")) {
    if (e.path.size() < 4 || e.path.compare(e.path.size() - 4, 4, "/in0") != 0) continue;
    INFO(e.key << "/" << e.path);
    ++time_inputs;
    if (p.time_input_exact)
      CHECK(io::compare_tensors(io::read_dumped_tensor(a, "rollout", e), io::read_dumped_tensor(b, "rollout", e))
                .bit_exact);
  }
  CHECK(time_inputs == static_cast<int64_t>(p.keys_per_rank * p.time_inputs_per_key));

  const auto table = test::ditrl("align " + dump_file(bf16, 0) + " " + dump_file(fp32, 0) + " --sides rollout,rollout");
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.output, Contains("first divergence") && Contains(first_divergence) && Contains("worst 10:"));
}

}  // namespace

#define DITRL_PARITY_FAMILY(family, ...)                                                                              \
  TEST_CASE("parity: " family " rollout vs train bit-exact in fp32 and bf16 and a bf16 run departs from an fp32 run", \
            "[e2e][parity]") {                                                                                        \
    check_family_parity(FamilyParity{family, __VA_ARGS__});                                                           \
  }

// The first tensor computed from the bf16-cast latents: the patch embedding.
DITRL_PARITY_FAMILY("sd3", "tiny_grpo.toml", "pos_embed/out0", 66)
DITRL_PARITY_FAMILY("wan", "../../standards/proxy_wan22_grpo.toml", "transformer.patch_embedding/out0", 17, 1,
                    ".attn1/out0")
DITRL_PARITY_FAMILY("ltx", "../../standards/proxy_ltx23_grpo.toml", "patchify_proj/out0", 57, 3, ".attn1/out0", true, 2)
DITRL_PARITY_FAMILY("qwen_image", "../../standards/proxy_qwen_image_grpo.toml", "img_in/out0", 44, 2, ".attn/out0",
                    false)
DITRL_PARITY_FAMILY("flux", "../../standards/proxy_flux1_grpo.toml", "x_embedder/out0", 50, 2, ".attn/out0", false)
// FLUX.2 records 1000 sigma in the hidden dtype first: a bf16 run departs there.
DITRL_PARITY_FAMILY("flux2", "../../standards/proxy_flux2_klein_grpo.toml", "time_guidance_embed/in0", 30, 1,
                    ".attn/out0", false)

TEST_CASE("align: bad arguments and files are named", "[e2e][parity]") {
  const std::string dir = test::fresh_output_dir("parity_align_errors");
  const auto missing = test::ditrl("align " + dir + "/a.h5 " + dir + "/b.h5");
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.output, Contains(dir + "/a.h5: no such dump file"));
  {
    io::TensorDumpWriter w(dir + "/a.h5");
    w.write("rollout", "r0_s0_t0", "proj_out", "out0", at::ones({2}));
  }
  const auto sides = test::ditrl("align " + dir + "/a.h5 " + dir + "/a.h5 --sides rollout");
  CHECK(sides.exit_code != 0);
  CHECK_THAT(sides.output, Contains("--sides 'rollout': expected SIDE_A,SIDE_B"));
  const auto no_train = test::ditrl("align " + dir + "/a.h5 " + dir + "/a.h5");
  CHECK(no_train.exit_code != 0);
  CHECK_THAT(no_train.output, Contains("no side 'train' (the file holds: rollout)"));
  const auto self = test::ditrl("align " + dir + "/a.h5 " + dir + "/a.h5 --sides rollout,rollout");
  CHECK(self.exit_code == 0);
  CHECK_THAT(self.output, Contains("100.00%") && Contains("first divergence      none"));
}
