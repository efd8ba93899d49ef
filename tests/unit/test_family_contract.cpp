// The contract a family keeps on its reference fixture (tests/fixtures/<family>/),
// checked once for every family it applies to: fp32 cases with every
// intermediate, the bf16 case bit for bit, LoRA starting at the base output,
// and a checkpoint that does not fit refused with one error listing every problem (negative controls: each
// change to the fixture's weights must show up); re-scoring a rollout step
// gives the rollout's velocity and log-prob bit for bit (step-0 parity), and
// sliced loading gives the full load's parameters. Checks that belong to one
// family stay in test_<family>.cpp. LTX takes the last two here; its fixture
// cases (audio and video, two model generations, each case its own grid and
// stored intermediates under ltx_core's names) are checked in test_ltx.cpp.

#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/guided.hpp>
#include <ditrl/models/parameter_source.hpp>
#include <ditrl/models/reference.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/rl/sigma_lookup.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/sampler.hpp>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "fixture_checks.hpp"
#include "model_fixtures.hpp"
#include "process.hpp"
#include "same_bits.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

using namespace ditrl;
using namespace ditrl::models;
using Catch::Matchers::Contains;
using test::fixture_architecture;
using test::fixture_path;
using test::same_bits;

namespace {

// The fixture's weights with tensors dropped, renamed, reshaped (zeros of
// another shape) or added, and the parts of the error each change makes.
struct BadCheckpoint {
  std::vector<std::string> dropped;
  std::map<std::string, std::string> renamed;
  std::map<std::string, std::vector<int64_t>> reshaped;
  std::vector<std::pair<std::string, std::vector<int64_t>>> added;
  std::vector<std::string> error;    // in load_weights' error
  std::vector<std::string> inspect;  // in `ditrl inspect`'s output
};

// LoRA on the family's default targets: the options, how many adapters, and
// one adapter whose nonzero B must move the output, on fixture case `fixture`.
struct LoraCase {
  int64_t seed;
  int64_t adapters;
  const char* moved;
  // LibTorch's matmul picks its kernel for a non-contiguous batched input by
  // whether the weight requires grad; a LoRA freezes the base weight, so a
  // model whose linears take such inputs (FLUX.2's text-stream attention
  // output at B = 2) departs from the unfrozen base in the last ulps. Such a
  // family is checked on a B = 1 case.
  const char* fixture;
};

struct sd3 {
  static constexpr const char* name = "sd3";
  // The tap records exactly the stored intermediates (SD3 has no parity dump points).
  static constexpr bool dump_points = false;
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {
        {"proj_out.bias", "norm_out.linear.bias"},
        {},
        {{"context_embedder.weight", {64, 33}}},
        {{"transformer_blocks.7.attn.to_q.weight", {2, 2}}},
        {"missing (2): norm_out.linear.bias, proj_out.bias", "unexpected (1): transformer_blocks.7.attn.to_q.weight",
         "wrong shape (1): context_embedder.weight (checkpoint [64, 33], model [64, 32])"},
        {"norm_out.linear.bias", "transformer_blocks.7.attn.to_q.weight",
         "context_embedder.weight (checkpoint [64, 33]"}};
  }
};

struct wan {
  static constexpr const char* name = "wan";
  static constexpr bool dump_points = true;
  // case_1: per-token timesteps (B, L), Wan2.2 TI2V.
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{},
            {{"blocks.1.attn2.to_k.weight", "blocks.1.attn2.to_kk.weight"}},
            {{"blocks.0.scale_shift_table", {1, 9, 64}}},
            {},
            {"missing (1): blocks.1.attn2.to_k.weight", "unexpected (1): blocks.1.attn2.to_kk.weight",
             "wrong shape (1): blocks.0.scale_shift_table (checkpoint [1, 9, 64], model [1, 6, 64])"},
            {"blocks.1.attn2.to_k.weight", "blocks.1.attn2.to_kk.weight",
             "blocks.0.scale_shift_table (checkpoint [1, 9, 64]"}};
  }
  // blocks x (attn1, attn2) x (to_q, to_k, to_v, to_out.0).
  static LoraCase lora() { return {5, 2 * 2 * 4, "blocks.0.attn2.to_v.lora_B.weight", "case_1"}; }
};

struct qwen_image {
  static constexpr const char* name = "qwen_image";
  static constexpr bool dump_points = true;
  // case_1: padded text (mask), odd-height grid.
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{},
            {{"txt_in.weight", "txt_in.kernel"}},
            {{"transformer_blocks.1.attn.norm_added_q.weight", {64}}},
            {},
            {"missing (1): txt_in.weight", "unexpected (1): txt_in.kernel",
             "wrong shape (1): transformer_blocks.1.attn.norm_added_q.weight (checkpoint [64], model [32])"},
            {"txt_in.weight", "txt_in.kernel", "transformer_blocks.1.attn.norm_added_q.weight (checkpoint [64]"}};
  }
  // 12 targets per block (docs/families.md §4.8).
  static LoraCase lora() { return {0, 2 * 12, "transformer_blocks.0.txt_mlp.net.2.lora_B.weight", "case_1"}; }
};

struct flux2 {
  static constexpr const char* name = "flux2";
  static constexpr bool dump_points = true;
  // case_0: guidance embedded; case_1: B = 2, odd grid, no guidance (the [klein] call).
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{},
            {{"context_embedder.weight", "context_embedder.kernel"}},
            {{"single_transformer_blocks.1.attn.norm_k.weight", {32}}},
            {},
            {"missing (1): context_embedder.weight", "unexpected (1): context_embedder.kernel",
             "wrong shape (1): single_transformer_blocks.1.attn.norm_k.weight (checkpoint [32], model [16])"},
            {"context_embedder.weight", "context_embedder.kernel",
             "single_transformer_blocks.1.attn.norm_k.weight (checkpoint [32]"}};
  }
  // 12 projections per double block, 1 per single block (docs/families.md §10.8).
  static LoraCase lora() {
    return {0, 2 * 12 + 2 * 1, "single_transformer_blocks.1.attn.to_qkv_mlp_proj.lora_B.weight", "case_0"};
  }
};

struct flux {
  static constexpr const char* name = "flux";
  static constexpr bool dump_points = true;
  // case_0: two samples, two guidance scales; case_1: odd grid, nonzero txt_ids.
  static std::vector<std::string> fp32_cases() { return {"case_0", "case_1"}; }
  static BadCheckpoint bad_checkpoint() {
    return {{"time_text_embed.guidance_embedder.linear_2.bias"},
            {{"single_transformer_blocks.1.proj_out.weight", "single_transformer_blocks.1.proj_out.kernel"}},
            {{"single_transformer_blocks.0.attn.norm_k.weight", {32}}},
            {{"single_transformer_blocks.0.attn.to_out.0.weight", {32, 32}}},
            {"missing (2): time_text_embed.guidance_embedder.linear_2.bias, "
             "single_transformer_blocks.1.proj_out.weight",
             "unexpected (2): single_transformer_blocks.0.attn.to_out.0.weight, "
             "single_transformer_blocks.1.proj_out.kernel",
             "wrong shape (1): single_transformer_blocks.0.attn.norm_k.weight (checkpoint [32], model [16])"},
            {"time_text_embed.guidance_embedder.linear_2.bias", "single_transformer_blocks.1.proj_out.kernel",
             "single_transformer_blocks.0.attn.norm_k.weight (checkpoint [32]"}};
  }
  // 8 targets per double block, to_q/k/v per single block.
  static LoraCase lora() { return {0, 2 * 8 + 2 * 3, "single_transformer_blocks.1.attn.to_k.lora_B.weight", "case_1"}; }
};

// The fixture's architecture, seeded init (on `device`).
std::string write_bad_checkpoint(const std::string& family, const BadCheckpoint& bad) {
  const io::SafetensorsFile weights(fixture_path(family + "/weights.safetensors"));
  io::NamedTensors tensors;
  for (const std::string& name : weights.names()) {
    if (std::find(bad.dropped.begin(), bad.dropped.end(), name) != bad.dropped.end()) continue;
    const auto renamed = bad.renamed.find(name);
    const auto reshaped = bad.reshaped.find(name);
    tensors.emplace_back(renamed != bad.renamed.end() ? renamed->second : name,
                         reshaped != bad.reshaped.end() ? at::zeros(reshaped->second) : weights.get(name));
  }
  for (const auto& [name, shape] : bad.added) tensors.emplace_back(name, at::zeros(shape));
  const std::string path = test::fresh_output_dir(family + "_bad_checkpoint") + "/bad.safetensors";
  io::write_safetensors(path, tensors);
  return path;
}

}  // namespace

TEMPLATE_TEST_CASE("family contract: fp32 fixture cases and every intermediate match the reference", "[models][family]",
                   sd3, wan, qwen_image, flux, flux2) {
  const std::string family = TestType::name;
  auto model = test::fixture_family(family);
  for (const std::string& name : TestType::fp32_cases()) {
    INFO(family << "/" << name);
    const ReferenceCase c = load_reference_case(fixture_path(family + "/" + name + ".safetensors"));
    const auto out = run_reference_case(*model, c, /*intermediates=*/true);
    for (const auto& [key, value] : out) {
      INFO(key);
      CHECK((c.stored.count(key) == 1 || (TestType::dump_points && test::is_dump_point(key))));
    }
    test::check_fp32_tensors(family + "/" + name, out, c.stored, test::fixture_fp32_ulps(family));
  }
}

TEMPLATE_TEST_CASE("family contract: bf16 fixture case with the fp32-kept parameters", "[models][family]", sd3, wan,
                   qwen_image, flux, flux2) {
  // Every op runs at the reference's rounding points (docs/families.md, per
  // family), so the bf16 output is the reference's bit for bit (fixtures made
  // on the LibTorch ditrl links).
  auto model = test::fixture_family(TestType::name);
  test::check_bf16_fixture_case(*model, TestType::name);
}

TEMPLATE_TEST_CASE("family contract: a checkpoint that does not fit is one error listing every problem",
                   "[models][family]", sd3, wan, qwen_image, flux, flux2) {
  const std::string family = TestType::name;
  const BadCheckpoint bad = TestType::bad_checkpoint();
  const std::string path = write_bad_checkpoint(family, bad);
  try {
    load_weights(*fixture_architecture(family), io::Checkpoint(path));
    FAIL("load_weights accepted " << path);
  } catch (const std::exception& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK_THAT(message, Contains(path));
    for (const std::string& part : bad.error) CHECK_THAT(message, Contains(part));
  }
  CHECK_THROWS_WITH(load_weights(*fixture_architecture(family, c10::kMeta),
                                 io::Checkpoint(fixture_path(family + "/weights.safetensors"))),
                    Contains("meta device"));

  const std::string config = fixture_path(family + "/config.json");
  const auto ok = test::run_process(fmt::format("{} inspect {} --family {} --config {}", DITRL_BINARY,
                                                fixture_path(family + "/weights.safetensors"), family, config));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("# matches family " + family));
  const auto refused =
      test::run_process(fmt::format("{} inspect {} --family {} --config {}", DITRL_BINARY, path, family, config));
  INFO(refused.output);
  CHECK(refused.exit_code != 0);
  for (const std::string& part : bad.inspect) CHECK_THAT(refused.output, Contains(part));
}

TEMPLATE_TEST_CASE("family contract: LoRA on the default targets starts at the base output", "[models][family][lora]",
                   wan, qwen_image, flux, flux2) {
  const LoraCase lora = TestType::lora();
  FamilyOptions o;
  o.lora.enabled = true;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.seed = lora.seed;
  auto adapted = test::fixture_family(TestType::name, o);
  auto base = test::fixture_family(TestType::name);
  int64_t adapters = 0;
  for (const auto& p : adapted->named_parameters()) {
    const bool is_lora = p.key().find(".lora_") != std::string::npos;
    CHECK(p.value().requires_grad() == is_lora);
    adapters += is_lora && p.key().find("lora_A") != std::string::npos;
  }
  CHECK(adapters == lora.adapters);
  const ReferenceCase c =
      load_reference_case(fixture_path(std::string(TestType::name) + "/" + lora.fixture + ".safetensors"));
  CHECK(
      at::equal(run_reference_case(*adapted, c, false).at("output"), run_reference_case(*base, c, false).at("output")));
  // A nonzero B moves the output (the negative control).
  {
    torch::NoGradGuard no_grad;
    adapted->named_parameters()[lora.moved].fill_(0.05);
  }
  CHECK_FALSE(
      at::equal(run_reference_case(*adapted, c, false).at("output"), run_reference_case(*base, c, false).at("output")));
}

namespace {

// A rollout of 4 samples (2 prompts, micro-groups of 2) over 3 steps with 2
// SDE steps, on the family's tiny preset in a `forward`-dtype forward, with
// the family's guidance.
struct Rollout {
  std::shared_ptr<Family> model;
  diffusion::Schedule schedule;
  rl::StepSelection steps;
  rollout::SampleBatch batch;
  Cond negative;
  GuidanceOptions guidance;
  rollout::Trajectories trajectories;
};

const diffusion::StepKernel kSde{diffusion::SdeType::Sde, 0.7};

Rollout sample_rollout(const std::string& family, c10::ScalarType forward) {
  Rollout r;
  const LatentGrid grid{1, 8, 8};
  FamilyOptions o;
  o.family = family;
  o.init_seed = 3;
  o.latent_grid = grid;
  using precision::InputDtype;
  o.inputs =
      precision::InputPolicy::resolve(InputDtype::Default, InputDtype::Default, InputDtype::Passthrough, forward);
  r.model = create_family(o);
  if (forward != at::kFloat) r.model->to(forward);
  r.schedule = family_schedule(family, {3, std::nullopt, grid.frames, grid.height, grid.width, "tiny", ""});
  r.steps = rl::sde_window(3, 2, 0, 2, 11);  // steps 0 and 1
  const auto prompts = rollout::synthetic_prompts(r.model->cond_spec(), 2, 0);
  const std::vector<int64_t> ids = {0, 0, 1, 1};
  r.batch.seeds = {1000, 1001, 1002, 1003};
  r.batch.cond = prompts->fetch(ids);
  r.batch.prompt_index = at::tensor(ids, at::kLong);
  r.batch.sample_index = at::arange(4, at::kLong);
  const std::vector<int64_t> shape = r.model->latent_shape(1, grid);
  r.batch.latent_shape.assign(shape.begin() + 1, shape.end());
  const bool guided = find_family_traits(family)->guided;
  r.negative = prompts->negative(4);
  r.batch.negative = guided ? &r.negative : nullptr;
  r.guidance.scale = guided ? 4.0 : 1.0;
  rollout::SamplerOptions options;
  options.kernel = kSde;
  options.microgroup = 2;
  options.guidance = r.guidance;
  r.trajectories = rollout::sample(*r.model, ForwardContext{}, r.schedule, r.steps, r.batch, options);
  return r;
}

// Each SDE step of each micro-group forwarded again as training does (grad
// on, the timesteps looked up in the rollout's snapshot): the velocity and the
// log-prob of the recorded next latent, against the rollout's.
void check_rescored_steps(const Rollout& r) {
  const rollout::Trajectories& t = r.trajectories;
  for (int64_t step : r.steps.sde_steps) {
    const int64_t k = t.latent_slot(step), k1 = t.latent_slot(step + 1), j = t.sde_slot(step);
    for (int64_t begin = 0; begin < 4; begin += 2) {
      INFO("step " << step << " samples " << begin << ".." << begin + 1);
      const at::Tensor x = t.latents.narrow(0, begin, 2).select(1, k);
      const at::Tensor x_next = t.latents.narrow(0, begin, 2).select(1, k1);
      const at::Tensor ts = r.schedule.timesteps.narrow(0, step, 1).expand({2}).contiguous();
      const rl::SnapshotEntries e = rl::lookup_sigmas(*t.snapshot, ts);
      Cond cond, neg;
      for (const auto& [name, tensor] : r.batch.cond.tensors) cond.tensors[name] = tensor.narrow(0, begin, 2);
      for (const auto& [name, tensor] : r.negative.tensors) neg.tensors[name] = tensor.narrow(0, begin, 2);
      ForwardContext ctx;
      ctx.host_timesteps = ts;
      const double step_t = static_cast<double>(r.schedule.timesteps[step].item<float>());
      const at::Tensor v = guided_velocity(*r.model, {x, e.timesteps, e.sigmas, &cond, &neg, step_t}, r.guidance, ctx);
      const diffusion::StepResult s = diffusion::sde_step(kSde, v, x, {e.sigmas, e.sigmas_next, t.snapshot->sigma(1)},
                                                          diffusion::StepTarget::score(x_next));
      CHECK(same_bits(v.to(at::kFloat), t.model_outputs.narrow(0, begin, 2).select(1, j)));
      CHECK(same_bits(s.log_prob, t.log_probs.narrow(0, begin, 2).select(1, j)));
      // Negative control: the other micro-group's velocity is not this one's.
      CHECK_FALSE(same_bits(v.to(at::kFloat), t.model_outputs.narrow(0, 2 - begin, 2).select(1, j)));
    }
  }
}

// Every parameter `source` supplies, in its order: read whole, in three
// ranges with unaligned boundaries and into a bf16 slice, against the full
// model's (`full`) flattened value; the sliced model's buffers against the
// full one's.
void check_slices(ParameterSource& source, Family& sliced, Family& full) {
  std::map<std::string, at::Tensor> values, held, buffers;
  for (const auto& p : full.named_parameters()) values[p.key()] = p.value().detach().reshape(-1);
  for (const auto& p : sliced.named_parameters()) held[p.key()] = p.value();
  for (const auto& b : full.named_buffers()) buffers[b.key()] = b.value();
  REQUIRE(source.order().size() == values.size());
  for (const std::string& name : source.order()) {
    INFO(name);
    REQUIRE(values.count(name) == 1);
    CHECK(held.at(name).is_meta());
    const at::Tensor& whole = values.at(name);
    const int64_t n = whole.numel(), a = n / 3, b = n - n / 5;
    CHECK(same_bits(source.read(name, 0, n).to(at::kFloat), whole));
    CHECK(same_bits(at::cat({source.read(name, 0, a), source.read(name, a, b), source.read(name, b, n)}).to(at::kFloat),
                    whole));
    const at::Tensor out = at::empty({b - a}, at::kBFloat16);
    source.read_into(name, a, b, out);
    CHECK(same_bits(out, whole.slice(0, a, b).to(at::kBFloat16)));
    // Negative control: a range read one element off is seen (a seeded
    // source is read in order: checked while `name` is its current one).
    if (name == source.order().front())
      CHECK_FALSE(same_bits(source.read(name, 1, n).to(at::kFloat), whole.slice(0, 0, n - 1)));
  }
  for (const auto& b : sliced.named_buffers()) {
    INFO(b.key());
    CHECK(same_bits(b.value(), buffers.at(b.key())));
  }
}

// The two checks below run every family in one test process each (a
// DYNAMIC_SECTION per family): each family's part takes 0.01-0.2 s, less than
// a test process's start.
const std::vector<std::string> kFamilies = {"sd3", "wan", "qwen_image", "ltx", "flux", "flux2"};

}  // namespace

TEST_CASE("family contract: step 0 - re-scoring a rollout step gives its velocity and log-prob bitwise",
          "[models][family][parity]") {
  // The sampler runs in inference mode, training with autograd on; at the
  // first optimizer step the policy is the rollout's, so the two forwards of
  // one step must agree bit for bit (the e2e parity test checks the whole
  // `ditrl train` path; this one each family's forward).
  for (const std::string& family : kFamilies) DYNAMIC_SECTION(family) {
      for (c10::ScalarType forward : {at::kFloat, at::kBFloat16}) {
        INFO(family << " forward " << c10::toString(forward));
        check_rescored_steps(sample_rollout(family, forward));
      }
    }
}

TEST_CASE("family contract: sliced loading gives the full load's parameters slice by slice",
          "[models][family][sliced]") {
  for (const std::string& family : kFamilies) DYNAMIC_SECTION(family) {
      FamilyOptions o;
      o.family = family;
      o.config_json = fixture_path(family + "/config.json");
      o.sliced = true;
      {
        INFO(family << " weights file");
        auto sliced = create_family(o);
        const auto source = checkpoint_source(*sliced, {{sliced, fixture_path(family + "/weights.safetensors")}});
        check_slices(*source, *sliced, *test::fixture_family(family));
      }
      if (std::filesystem::exists(fixture_path(family + "/bfl.safetensors"))) {
        INFO(family << " Black Forest Labs' single file (fused q, k, v; swapped modulation halves)");
        auto sliced = create_family(o);
        const auto source = checkpoint_source(*sliced, {{sliced, fixture_path(family + "/bfl.safetensors")}});
        check_slices(*source, *sliced, *test::fixture_family(family));
      }
      {
        INFO(family << " seeded init");
        o.init_seed = 7;
        auto sliced = create_family(o);
        const auto source = seeded_source(*sliced, o.init_seed);
        o.sliced = false;
        check_slices(*source, *sliced, *create_family(o));
      }
    }
}
