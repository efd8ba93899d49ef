// Training-step speed of ditrl's model families against diffusers' own
// transformer class for each family (benchmarks/peer/peer_diffusers.py, PyTorch
// eager with SDPA, the same torch build ditrl links): forward + backward +
// AdamW step on the same weights (one safetensors file both sides load), the
// same inputs and the same number of intra-op threads, for each family's tiny
// preset (framework overhead dominates) and a ~100M-parameter config (GEMMs
// dominate). Writes benchmarks/results/peer_forward.md.
//
// Variants (--variants): `fp32-eager` = ditrl's modules with
// torch::optim::AdamW against diffusers in fp32; `fp32-sharded` /
// `bf16-sharded` = ditrl's training path (shard::ShardedParams on one rank:
// fp32 masters, fp32 or bf16 compute copies, every block recomputed in
// backward, ditrl's AdamW) against diffusers with fp32 parameters, in fp32 or
// under bf16 autocast. `-sharded-keep` keeps every block's graph from forward
// to backward (`parallel.recompute = false`: no recompute, like diffusers'
// default). A `-ckpt` suffix turns on diffusers' gradient checkpointing (the
// same recompute as ditrl's default sharded step).
//
// A family is a list of cases (config.json object, batch, latent grid, text
// length) in kFamilies; everything else goes through the Family interface
// (create_family, latent_shape, cond_spec, noise_pred). Adding one = a
// `<family>_cases()` function here, one kFamilies entry, and its class and
// velocity() in benchmarks/peer/peer_diffusers.py.

#include <ditrl/app/named_option.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include "peer/peer_cases.hpp"
#include "peer/peer_harness.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>
#include <boost/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace ditrl;

namespace {

using peer::Case;
using peer::kFamilies;
using peer::make_family;
using peer::prepare_case;
using peer::training_plan;

// One comparison: the two sides' precision, how ditrl trains (its modules
// with torch::optim::AdamW, or its ShardedParams training path), and whether
// diffusers recomputes blocks in backward (gradient checkpointing).
struct Variant {
  std::string name;
  c10::ScalarType compute = at::kFloat;
  bool sharded = false;
  bool recompute = true;     // sharded: rebuild each block's graph in backward
  bool fused_adamw = false;  // sharded: LibTorch's fused AdamW kernel (--fused-adamw)
  bool peer_checkpointing = false;
};

Variant parse_variant(const std::string& name) {
  Variant v{name};
  std::string rest = name;
  const auto take = [&](const std::string& prefix) {
    if (rest.rfind(prefix, 0) != 0) return false;
    rest = rest.substr(prefix.size());
    return true;
  };
  if (take("bf16-"))
    v.compute = at::kBFloat16;
  else if (!take("fp32-"))
    throw std::runtime_error("variant '" + name + "': expected fp32-... or bf16-...");
  if (take("sharded"))
    v.sharded = true;
  else if (!take("eager"))
    throw std::runtime_error("variant '" + name + "': expected <precision>-eager or <precision>-sharded");
  if (v.sharded && take("-keep")) v.recompute = false;
  if (v.compute != at::kFloat && !v.sharded)
    throw std::runtime_error("variant '" + name + "': ditrl's bf16 compute is its sharded path (bf16-sharded)");
  v.peer_checkpointing = rest == "-ckpt";
  if (!rest.empty() && !v.peer_checkpointing)
    throw std::runtime_error("variant '" + name + "': unknown suffix '" + rest + "' (only -ckpt)");
  return v;
}

constexpr double kLr = 1e-4;
constexpr double kWeightDecay = 0.01;  // torch.optim.AdamW's default, on both sides

// ditrl's side: the family loaded from the shared files, trained either with
// LibTorch's AdamW on its own parameters (eager) or through ShardedParams on
// one rank (sharded: what `ditrl train` runs).
class DitrlTrainer {
 public:
  DitrlTrainer(const std::string& family, const std::string& config, const std::string& weights,
               const std::string& inputs, const Variant& variant, models::AttentionBackend attention,
               dist::Communicator& comm) {
    family_ = make_family(family, config, variant.compute, attention);
    models::load_weights(*family_, io::Checkpoint(weights));
    for (const auto& p : family_->parameters()) params += p.numel();
    if (variant.sharded) {
      shard::ShardOptions options;
      options.adamw.weight_decay = kWeightDecay;
      options.recompute = variant.recompute;
      options.adamw.fused = variant.fused_adamw;
      sharded_ = std::make_unique<shard::ShardedParams>(*family_, family_->wrap_units(),
                                                        training_plan(*family_, variant.compute), comm, options);
      ctx_.runner = sharded_.get();
    } else {
      optimizer_ = std::make_unique<torch::optim::AdamW>(family_->parameters(),
                                                         torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
    }
    const io::SafetensorsFile file(inputs);
    x_ = file.get("latents");
    t_ = file.get("timesteps");
    sigma_ = file.get("sigmas");
    target_ = file.get("target");
    for (const models::CondSpec& spec : family_->cond_spec()) cond_.tensors[spec.name] = file.get("cond." + spec.name);
  }

  peer::Timing run(int steps) {
    const auto loss = [&] {
      return at::mse_loss(family_->noise_pred(x_, t_, sigma_, cond_, ctx_).to(at::kFloat), target_);
    };
    if (!sharded_) return peer::train_steps(*family_, *optimizer_, steps, loss);
    return peer::timed_steps(steps, [&] {
      sharded_->zero_grad();
      sharded_->begin_step();
      const at::Tensor value = loss();
      value.backward();
      sharded_->finish_backward();
      sharded_->adamw_step(kLr);
      return value.item<double>();
    });
  }

  int64_t params = 0;

 private:
  std::shared_ptr<models::Family> family_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<shard::ShardedParams> sharded_;
  models::ForwardContext ctx_;
  at::Tensor x_, t_, sigma_, target_;
  models::Cond cond_;
};

struct Row {
  std::string family, config, variant, malloc_mode;
  int threads;
  double params_m;
  std::string tokens;
  peer::Summary s;
};

Row measure(const Case& c, const std::string& dir, const Variant& variant, models::AttentionBackend attention,
            int threads, bool tuned, const std::string& python, const std::string& script, dist::Communicator& comm) {
  at::set_num_threads(threads);
  const std::string config = dir + "/config.json", weights = dir + "/weights.safetensors",
                    inputs = dir + "/inputs.safetensors";
  DitrlTrainer ours(c.family, config, weights, inputs, variant, attention, comm);
  std::vector<std::string> argv = {python,        script,
                                   "--family",    c.family,
                                   "--config",    config,
                                   "--weights",   weights,
                                   "--inputs",    inputs,
                                   "--threads",   std::to_string(threads),
                                   "--precision", variant.compute == at::kFloat ? "fp32" : "bf16"};
  if (variant.peer_checkpointing) argv.push_back("--checkpointing");
  peer::PythonPeer python_side(argv, tuned);
  const peer::Comparison cmp = peer::alternate(ours, python_side, c.warmup, c.rounds, c.steps_per_round);
  Row row{c.family,
          c.name,
          variant.name,
          tuned ? "tuned" : "default",
          threads,
          ours.params / 1e6,
          fmt::format("{} x ({} + {})", c.batch, c.image_tokens, c.text_tokens),
          peer::summarize(cmp)};
  std::cerr << fmt::format("{} {} {} threads={} malloc={} load={}: {}\n", row.family, row.config, row.variant, threads,
                           row.malloc_mode, peer::load_average(), peer::speed(row.s));
  return row;
}

struct Settings {
  peer::Options o{"peer_forward"};
  std::vector<std::string> families;
  std::vector<std::string> variant_names = {"fp32-eager", "fp32-sharded", "bf16-sharded"};
  models::AttentionBackend attention = models::AttentionBackend::Math;
  bool fused_adamw = false;
  std::string fp32_gemm = "auto";
};

std::vector<std::string> known_families() {
  std::vector<std::string> known;
  for (const auto& [name, bench] : kFamilies) known.push_back(name);
  return known;
}

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--families", s.families, "model families to measure (default: all)")->delimiter(',');
  app.add_option("--variants", s.variant_names,
                 "fp32-eager | fp32-sharded[-keep] | bf16-sharded[-keep], optionally with -ckpt (diffusers' gradient "
                 "checkpointing); -keep: ditrl without recompute")
      ->delimiter(',');
  app::add_named_option(app, "--attention", s.attention, models::kAttentionNames,
                        {models::AttentionBackend::Math, models::AttentionBackend::Flash},
                        "ditrl's attention backend: math | flash");
  app.add_flag("--fused-adamw", s.fused_adamw, "ditrl's sharded variants use LibTorch's fused AdamW kernel");
  app.add_option("--cpu-fp32-gemm", s.fp32_gemm,
                 "ditrl's fp32 GEMMs (precision.cpu_fp32_gemm of a deck that is not deterministic): auto | blas | "
                 "onednn")
      ->check(CLI::IsMember({"auto", "blas", "onednn"}));
  s.o.add_to(app);
}

std::vector<Variant> variants_of(const Settings& s) {
  std::vector<Variant> variants;
  for (const std::string& name : s.variant_names) {
    variants.push_back(parse_variant(name));
    variants.back().fused_adamw = s.fused_adamw;
  }
  return variants;
}

// Every case of the chosen families; nothing, with the error printed, for a family not benchmarked.
std::optional<std::vector<Case>> cases_of(const Settings& s) {
  std::vector<Case> cases;
  for (const std::string& family : s.families) {
    const auto it = kFamilies.find(family);
    if (it == kFamilies.end()) {
      std::cerr << "unknown family '" << family << "': benchmarked families are "
                << fmt::format("{}", fmt::join(known_families(), ", ")) << "\n";
      return std::nullopt;
    }
    for (const Case& c : it->second.cases(s.o.tiny_rounds, s.o.big_rounds)) cases.push_back(c);
  }
  return cases;
}

// Every case, variant and thread count, in each malloc mode.
std::vector<Row> measure_all(const Settings& s, const std::vector<Variant>& variants, const std::vector<Case>& cases,
                             dist::Communicator& comm) {
  // Not __FILE__: ccache's CCACHE_BASEDIR makes that path relative to the build directory.
  const std::string script = (fs::path(DITRL_BENCHMARKS_DIR) / "peer" / "peer_diffusers.py").string();
  std::vector<Row> rows;
  peer::for_each_malloc_mode(s.o.skip_tuned, [&](bool tuned) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].rounds <= 0) continue;
      const std::string dir = s.o.work + "/" + cases[i].family + std::to_string(i);
      if (!tuned) prepare_case(cases[i], dir);
      for (const Variant& variant : variants)
        for (int threads : s.o.thread_counts)
          rows.push_back(measure(cases[i], dir, variant, s.attention, threads, tuned, s.o.python, script, comm));
    }
  });
  return rows;
}

// The method and the table's header.
void write_method(std::ostream& md) {
  md << "# peer_forward: ditrl vs diffusers (PyTorch eager), training step per model family\n\n"
     << "Forward + backward + AdamW step (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on both sides) of a\n"
     << "family's DiT (ditrl: `Family::noise_pred` on the family's latent layout; Python: diffusers' own class for "
        "the\n"
     << "family, benchmarks/peer/peer_diffusers.py), MSE loss against a fixed target, the same weights read from one\n"
     << "safetensors file by both sides, the same inputs and the same number of intra-op threads. After warm-up\n"
     << "steps the two sides alternate rounds of steps, so both see the same background load on a shared machine;\n"
     << "the table gives the median step time and the fastest step. Speedup = median diffusers time / median ditrl\n"
     << "time (> 1: ditrl is faster). The loss columns compare the two sides' losses at the first and the last\n"
     << "step.\n\n"
     << "Variants: `fp32-eager` = ditrl's modules + `torch::optim::AdamW` vs diffusers fp32 + `torch.optim.AdamW`;\n"
     << "`fp32-sharded` / `bf16-sharded` = ditrl's training path (`shard::ShardedParams` on one rank: fp32 masters\n"
     << "and AdamW on flat slices, fp32 or bf16 compute copies with the family's fp32-kept parameters, every block\n"
     << "recomputed in backward) vs diffusers with fp32 parameters, in fp32 or under `torch.autocast(\"cpu\",\n"
     << "bfloat16)`; `-sharded-keep` = the same path with `parallel.recompute = false` (every block keeps its\n"
     << "forward's graph, no recompute: like diffusers' default); `-ckpt` = diffusers with\n"
     << "`enable_gradient_checkpointing()` (the same recompute as ditrl's default sharded step). "
     << peer::malloc_modes_text() << " `page faults/step` is the median count\n"
     << "of minor page faults per step in each process.\n\n"
     << "| family | config | params | batch x (image + text tokens) | variant | threads | malloc | timed steps | ditrl "
        "ms/step | diffusers ms/step | speedup | min ditrl / diffusers ms | page faults/step ditrl / diffusers | "
        "rel. loss gap first / last step |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
}

// How the run was made: command, dates, machine, both sides' settings.
void write_setup(std::ostream& md, const Settings& s, const std::string& command, const std::string& started,
                 const std::string& load_at_start) {
  md << "\n- Command: `" << command << "`\n"
     << "- Date: " << started << " to " << peer::utc_now() << "\n"
     << "- Machine: " << peer::cpu_model() << ", " << std::thread::hardware_concurrency()
     << " hardware threads; 1-minute load average " << load_at_start << " at the start, " << peer::load_average()
     << " at the end (anything above the benchmark's own 1 is other work sharing the cores)\n"
     << "- ditrl: LibTorch " << TORCH_VERSION << " (C++), `" << name_of(models::kAttentionNames, s.attention)
     << "` attention ("
     << (s.attention == models::AttentionBackend::Math ? "matmul, softmax, matmul"
                                                       : "LibTorch's CPU flash kernel, as the peer's SDPA picks")
     << "), sharded variants' AdamW: "
     << (s.fused_adamw ? "LibTorch's fused kernel (`train.fused_adamw`)"
                       : "ditrl's chunked passes over the flat slices")
     << ", fp32 GEMMs: "
     << (ditrl::precision::cpu_fp32_gemm() == ditrl::precision::CpuFp32Gemm::Onednn
             ? "oneDNN's from 2^20 multiply-adds up"
             : "LibTorch's BLAS")
     << " (`precision.cpu_fp32_gemm = \"" << s.fp32_gemm << "\"`)\n"
     << "- diffusers peer: " << s.o.python << ", torch " << peer::python_torch_version(s.o.python) << ", diffusers "
     << peer::python_module_version(s.o.python, "diffusers")
     << " (the torch wheel whose LibTorch ditrl links), benchmarks/peer/peer_diffusers.py: "
        "`<Class>.from_config(config.json)`,\n"
     << "  `load_state_dict(strict=True)` of the shared weights, diffusers' default attention processor\n"
     << "  (`F.scaled_dot_product_attention`), `torch.optim.AdamW`, `zero_grad(set_to_none=True)`; a child process\n"
     << "  driven over a pipe\n";
}

// The configs of the table's `config` column.
void write_configs(std::ostream& md) {
  md << "- sd3 (SD3Transformer2DModel): `tiny` = the sd3 `tiny` preset (4 blocks, D = 64, two dual-attention blocks,\n"
     << "  qk RMSNorm); `sd3-110m` = SD3.5-medium structure at D = 768 (12 heads x 64), 5 blocks, block 0 dual, qk\n"
     << "  RMSNorm, joint_attention_dim 4096, pooled 2048, latent 16 x 32 x 32.\n"
     << "- wan (WanTransformer3DModel, one expert): `tiny` = the wan `tiny` preset (2 blocks, 2 heads x 32, ffn 128,\n"
     << "  text 32); `wan-103m` = D = 768 (6 heads x 128), 10 blocks, ffn 3072, UMT5 text width 4096, freq_dim 256,\n"
     << "  latent 16 x 4 x 16 x 16 (frames x height x width).\n"
     << "- qwen_image (QwenImageTransformer2DModel): `tiny` = the qwen_image `tiny` preset (2 blocks, 4 heads x 16,\n"
     << "  RoPE axes 4/6/6, text 32); `qwen-111m` = D = 768 (6 heads x 128, axes 16/56/56), 5 blocks, text width\n"
     << "  3584, latent 16 x 32 x 32 packed 2x2 (the peer packs/unpacks around the forward like ditrl's noise_pred);\n"
     << "  the all-ones text mask is dropped on both sides.\n"
     << "- flux (FluxTransformer2DModel, without the guidance embedder): `tiny` = the flux `tiny-schnell` preset (2\n"
     << "  double + 2 single blocks, 4 heads x 16, RoPE axes 4/6/6, text 32, pooled 24); `flux-75m` = D = 768 (6 "
        "heads\n"
     << "  x 128, axes 16/56/56), 2 double + 3 single blocks, T5 width 4096, pooled 768, latent 16 x 32 x 32 packed\n"
     << "  2x2 with the pipeline's img_ids / txt_ids on both sides.\n"
     << "- flux2 (Flux2Transformer2DModel): `tiny` = the flux2 `tiny` preset (2 double + 2 single blocks, 4 heads x "
        "16,\n"
     << "  RoPE axes 4 x 4, text 32); `flux2-78m` = FLUX.2 [klein] structure at D = 768 (6 heads x 128, axes 4 x "
        "32),\n"
     << "  2 double + 4 single blocks, text width 7680, latent 16 x 16 x 16 patchified (256 tokens), no guidance\n"
     << "  embedding; both sides pack row-major and pass the pipeline's int64 ids.\n";
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  const auto comm = dist::make_mpi_communicator();
  if (comm->size() != 1) {
    std::cerr << "bench_peer_forward runs on one rank (the sharded variants shard over one rank)\n";
    return 2;
  }
  Settings s;
  s.families = known_families();
  CLI::App app{"ditrl vs diffusers (PyTorch eager): forward+backward+AdamW step time per model family"};
  add_options(app, s);
  CLI11_PARSE(app, argc, argv);
  ditrl::precision::set_cpu_fp32_gemm(ditrl::precision::parse_cpu_fp32_gemm(s.fp32_gemm, false));
  s.o.sort_threads();
  const std::vector<Variant> variants = variants_of(s);
  const std::optional<std::vector<Case>> cases = cases_of(s);
  if (!cases) return 2;
  const std::string load_at_start = peer::load_average();
  const std::string started = peer::utc_now();
  const std::vector<Row> rows = measure_all(s, variants, *cases, *comm);

  std::ofstream md(s.o.out);
  write_method(md);
  for (const Row& r : rows)
    md << fmt::format("| {} | {} | {:.1f} M | {} | {} | {} | {} | {} |\n", r.family, r.config, r.params_m, r.tokens,
                      r.variant, r.threads, r.malloc_mode, peer::cells(r.s));
  write_setup(md, s, peer::command_line(argc, argv), started, load_at_start);
  write_configs(md);
  std::cerr << "wrote " << s.o.out << "\n";
  return 0;
}
