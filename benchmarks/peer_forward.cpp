// Training-step speed of ditrl's model families against the same models in
// Python PyTorch eager (benchmarks/peer_forward.py + peer_<family>.py):
// forward + backward + AdamW step on the same weights (one safetensors file
// both sides load), the same inputs and the same number of intra-op threads,
// for each family's tiny preset (framework overhead dominates) and a
// ~100M-parameter config (GEMMs dominate). Writes
// benchmarks/results/peer_forward.md.
//
// A family is a list of cases (config.json object, batch, latent grid, text
// length) in kFamilies; everything else goes through the Family interface
// (create_family, latent_shape, cond_spec, noise_pred). Adding one = a
// `<family>_cases()` function here, one kFamilies entry, and
// benchmarks/peer_<family>.py with build(config) and velocity(model, inputs).

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/weights.hpp>

#include "peer_harness.hpp"

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
#include <sstream>
#include <thread>

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace ditrl;

namespace {

struct Case {
  std::string family;   // create_family name
  std::string name;     // row label
  json::object config;  // the config.json both sides build the model from
  int64_t batch;
  models::LatentGrid grid;
  int64_t image_tokens, text_tokens;
  int warmup, rounds, steps_per_round;
};

json::object sd3_config(int64_t sample_size, int64_t layers, int64_t heads, int64_t head_dim, int64_t joint_dim,
                        int64_t pooled_dim, int64_t pos_embed_max_size, json::array dual) {
  return {{"_class_name", "SD3Transformer2DModel"},
          {"sample_size", sample_size},
          {"patch_size", 2},
          {"in_channels", 16},
          {"num_layers", layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"caption_projection_dim", heads * head_dim},
          {"pooled_projection_dim", pooled_dim},
          {"out_channels", 16},
          {"pos_embed_max_size", pos_embed_max_size},
          {"dual_attention_layers", std::move(dual)},
          {"qk_norm", "rms_norm"}};
}

// The sd3 `tiny` preset, and ~110M parameters: SD3.5-medium's structure (qk
// RMSNorm, a dual-attention block, the real text widths) at width 768 and 5
// blocks.
std::vector<Case> sd3_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = sd3_config(16, 4, 4, 16, 48, 32, 12, {0, 1});
  return {
      {"sd3", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
      {"sd3", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
      {"sd3", "sd3-110m", sd3_config(64, 5, 12, 64, 4096, 2048, 64, {0}), 2, {1, 32, 32}, 256, 128, 3, big_rounds, 1}};
}

json::object wan_config(int64_t layers, int64_t heads, int64_t head_dim, int64_t ffn_dim, int64_t text_dim,
                        int64_t freq_dim) {
  return {{"_class_name", "WanTransformer3DModel"},
          {"patch_size", json::array{1, 2, 2}},
          {"num_attention_heads", heads},
          {"attention_head_dim", head_dim},
          {"in_channels", 16},
          {"out_channels", 16},
          {"text_dim", text_dim},
          {"freq_dim", freq_dim},
          {"ffn_dim", ffn_dim},
          {"num_layers", layers},
          {"cross_attn_norm", true},
          {"qk_norm", "rms_norm_across_heads"},
          {"eps", 1e-6},
          {"rope_max_seq_len", 1024}};
}

// The wan `tiny` preset, and ~103M parameters: Wan2.1's structure at width
// 768 (6 heads x 128, the released head dim) with 10 blocks, UMT5 text width
// 4096, a 4 x 16 x 16 latent video (256 tokens).
std::vector<Case> wan_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = wan_config(2, 2, 32, 128, 32, 256);
  return {{"wan", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"wan", "tiny", tiny, 2, {4, 8, 8}, 64, 8, 10, tiny_rounds, 10},
          {"wan", "wan-103m", wan_config(10, 6, 128, 3072, 4096, 256), 2, {4, 16, 16}, 256, 128, 3, big_rounds, 1}};
}

json::object qwen_image_config(int64_t layers, int64_t heads, int64_t head_dim, int64_t joint_dim, json::array axes) {
  return {{"_class_name", "QwenImageTransformer2DModel"},
          {"patch_size", 2},
          {"in_channels", 64},
          {"out_channels", 16},
          {"num_layers", layers},
          {"attention_head_dim", head_dim},
          {"num_attention_heads", heads},
          {"joint_attention_dim", joint_dim},
          {"guidance_embeds", false},
          {"axes_dims_rope", std::move(axes)}};
}

// The qwen_image `tiny` preset, and ~111M parameters: Qwen-Image's structure
// at width 768 (6 heads x 128, RoPE axes 16/56/56) with 5 blocks, text width
// 3584, a 32 x 32 latent (256 packed tokens).
std::vector<Case> qwen_image_cases(int tiny_rounds, int big_rounds) {
  const json::object tiny = qwen_image_config(2, 4, 16, 32, {4, 6, 6});
  return {{"qwen_image", "tiny", tiny, 1, {1, 8, 8}, 16, 8, 10, tiny_rounds, 10},
          {"qwen_image", "tiny", tiny, 2, {1, 16, 16}, 64, 8, 10, tiny_rounds, 10},
          {"qwen_image",
           "qwen-111m",
           qwen_image_config(5, 6, 128, 3584, {16, 56, 56}),
           2,
           {1, 32, 32},
           256,
           128,
           3,
           big_rounds,
           1}};
}

struct FamilyBench {
  std::vector<Case> (*cases)(int tiny_rounds, int big_rounds);
  // Conditioning tensors whose first per-prompt dimension is the text length.
  std::vector<std::string> text_conds;
};

const std::map<std::string, FamilyBench> kFamilies = {
    {"sd3", {sd3_cases, {"encoder_hidden_states"}}},
    {"wan", {wan_cases, {"encoder_hidden_states"}}},
    {"qwen_image", {qwen_image_cases, {"encoder_hidden_states", "encoder_hidden_states_mask"}}},
};

std::shared_ptr<models::Family> make_family(const std::string& family, const std::string& config) {
  models::FamilyOptions options;
  options.family = family;
  options.config_json = config;
  options.init_seed = 1234;
  return models::create_family(options);
}

// ditrl's side: the family loaded from the shared files, LibTorch's AdamW.
class DitrlTrainer {
 public:
  DitrlTrainer(const std::string& family, const std::string& config, const std::string& weights,
               const std::string& inputs) {
    family_ = make_family(family, config);
    models::load_weights(*family_, io::Checkpoint(weights));
    optimizer_ = std::make_unique<torch::optim::AdamW>(family_->parameters(), torch::optim::AdamWOptions(1e-4));
    const io::SafetensorsFile file(inputs);
    x_ = file.get("latents");
    t_ = file.get("timesteps");
    sigma_ = file.get("sigmas");
    target_ = file.get("target");
    for (const models::CondSpec& spec : family_->cond_spec()) cond_.tensors[spec.name] = file.get("cond." + spec.name);
    for (const auto& p : family_->parameters()) params += p.numel();
  }

  peer::Timing run(int steps) {
    return peer::train_steps(*family_, *optimizer_, steps,
                             [&] { return at::mse_loss(family_->noise_pred(x_, t_, sigma_, cond_, {}), target_); });
  }

  int64_t params = 0;

 private:
  std::shared_ptr<models::Family> family_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  at::Tensor x_, t_, sigma_, target_;
  models::Cond cond_;
};

struct Row {
  std::string family, config, malloc_mode;
  int threads;
  double params_m;
  std::string tokens;
  peer::Summary s;
};

// Weights from ditrl's seeded init and inputs drawn in a fixed order:
// latents, the float conditioning tensors in cond_spec order (masks: all
// ones), timesteps linspace(100, 900), sigmas = timesteps / 1000, target.
void prepare_case(const Case& c, const std::string& dir) {
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << json::serialize(c.config);
  const auto family = make_family(c.family, dir + "/config.json");
  io::write_safetensors(dir + "/weights.safetensors", models::state_tensors(*family));
  const std::vector<std::string>& text_conds = kFamilies.at(c.family).text_conds;
  at::manual_seed(99);
  const std::vector<int64_t> latent_shape = family->latent_shape(c.batch, c.grid);
  io::NamedTensors inputs = {{"latents", at::randn(latent_shape)}};
  for (const models::CondSpec& spec : family->cond_spec()) {
    std::vector<int64_t> shape = {c.batch};
    shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
    if (std::find(text_conds.begin(), text_conds.end(), spec.name) != text_conds.end()) shape[1] = c.text_tokens;
    inputs.emplace_back("cond." + spec.name, c10::isFloatingType(spec.dtype)
                                                 ? at::randn(shape).to(spec.dtype)
                                                 : at::ones(shape, at::TensorOptions().dtype(spec.dtype)));
  }
  const at::Tensor t = at::linspace(100, 900, c.batch);
  inputs.emplace_back("timesteps", t);
  inputs.emplace_back("sigmas", t / 1000);
  inputs.emplace_back("target", at::randn(latent_shape));
  io::write_safetensors(dir + "/inputs.safetensors", inputs);
}

Row measure(const Case& c, const std::string& dir, int threads, bool tuned, const std::string& python,
            const std::string& script) {
  at::set_num_threads(threads);
  const std::string config = dir + "/config.json", weights = dir + "/weights.safetensors",
                    inputs = dir + "/inputs.safetensors";
  DitrlTrainer ours(c.family, config, weights, inputs);
  peer::PythonPeer python_side({python, script, "--family", c.family, "--config", config, "--weights", weights,
                                "--inputs", inputs, "--threads", std::to_string(threads)},
                               tuned);
  const peer::Comparison cmp = peer::alternate(ours, python_side, c.warmup, c.rounds, c.steps_per_round);
  Row row{c.family,
          c.name,
          tuned ? "tuned" : "default",
          threads,
          ours.params / 1e6,
          fmt::format("{} x ({} + {})", c.batch, c.image_tokens, c.text_tokens),
          peer::summarize(cmp)};
  std::cerr << fmt::format("{} {} threads={} malloc={}: {}\n", row.family, row.config, threads, row.malloc_mode,
                           peer::speed(row.s));
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  // Not __FILE__: ccache's CCACHE_BASEDIR makes that path relative to the build directory.
  const fs::path source_dir = DITRL_BENCHMARKS_DIR;
  peer::Options o("peer_forward");
  std::vector<std::string> known;
  for (const auto& [name, bench] : kFamilies) known.push_back(name);
  std::vector<std::string> families = known;
  CLI::App app{"ditrl vs Python PyTorch eager: forward+backward+AdamW step time per model family"};
  app.add_option("--families", families, "model families to measure (default: all)")->delimiter(',');
  o.add_to(app);
  CLI11_PARSE(app, argc, argv);
  o.sort_threads();

  std::vector<Case> cases;
  for (const std::string& family : families) {
    const auto it = kFamilies.find(family);
    if (it == kFamilies.end()) {
      std::cerr << "unknown family '" << family << "': benchmarked families are "
                << fmt::format("{}", fmt::join(known, ", ")) << "\n";
      return 2;
    }
    for (const Case& c : it->second.cases(o.tiny_rounds, o.big_rounds)) cases.push_back(c);
  }
  const std::string script = (source_dir / "peer_forward.py").string();
  const std::string load_at_start = peer::load_average();
  std::vector<Row> rows;
  peer::for_each_malloc_mode(o.skip_tuned, [&](bool tuned) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].rounds <= 0) continue;
      const std::string dir = o.work + "/" + cases[i].family + std::to_string(i);
      if (!tuned) prepare_case(cases[i], dir);
      for (int threads : o.thread_counts) rows.push_back(measure(cases[i], dir, threads, tuned, o.python, script));
    }
  });

  std::ofstream md(o.out);
  md << "# peer_forward: ditrl vs Python PyTorch eager, training step per model family\n\n"
     << "Forward + backward + AdamW step (lr 1e-4, default betas/eps/weight decay on both sides) of a family's DiT\n"
     << "(ditrl: `Family::noise_pred` on the family's latent layout; Python: the same model written the way the\n"
     << "reference writes it), MSE loss against a fixed target, the same weights read from one safetensors file by\n"
     << "both sides, the same inputs and the same number of intra-op threads. After warm-up steps the two sides\n"
     << "alternate rounds of steps, so both see the same background load on a shared machine; the table gives the\n"
     << "median step time and the fastest step. Speedup = median Python time / median ditrl time (> 1: ditrl is\n"
     << "faster). The loss columns compare the two sides' losses at the first and the last step: the peer is the\n"
     << "same model, not an approximation.\n"
     << "`malloc` = `default` runs both processes with glibc's defaults; `tuned` sets M_MMAP_THRESHOLD = 32 MiB\n"
     << "and M_TRIM_THRESHOLD = 1 GiB on both sides (mallopt in ditrl, MALLOC_*_ env in Python), which removes the\n"
     << "page-fault cost of glibc returning freed blocks to the kernel. `page faults/step` is the median count of\n"
     << "minor page faults per step in each process (memory touched for the first time after the allocator got it\n"
     << "from the kernel).\n\n"
     << "| family | config | params | batch x (image + text tokens) | threads | malloc | timed steps | ditrl ms/step | "
        "Python ms/step | speedup | min ditrl / Python ms | page faults/step ditrl / Python | "
        "rel. loss gap first / last step |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows)
    md << fmt::format("| {} | {} | {:.1f} M | {} | {} | {} | {} |\n", r.family, r.config, r.params_m, r.tokens,
                      r.threads, r.malloc_mode, peer::cells(r.s));
  md << "\n- Command: `" << peer::command_line(argc, argv) << "`\n"
     << "- Date: " << peer::utc_now() << "\n"
     << "- Machine: " << peer::cpu_model() << ", " << std::thread::hardware_concurrency()
     << " hardware threads; 1-minute load average " << load_at_start << " at the start, " << peer::load_average()
     << " at the end (anything above 0 is other work sharing the cores); BLAS " << peer::blas_library() << "\n"
     << "- ditrl: LibTorch " << TORCH_VERSION << " (C++), `math` attention, `torch::optim::AdamW`\n"
     << "- Python peer: " << o.python << ", torch " << peer::python_torch_version(o.python)
     << " (the same LibTorch build), benchmarks/peer_forward.py driving benchmarks/peer_<family>.py: plain\n"
     << "  nn.Module ports of the reference models (nn.Linear/nn.Conv*, F.layer_norm, the reference's RMSNorm "
        "flavour,\n"
     << "  GELU-tanh, math attention since torch 1.13 has no SDPA), weights loaded with load_state_dict(strict=True)\n"
     << "  through a small safetensors reader (Debian has no safetensors package), `torch.optim.AdamW` with its\n"
     << "  defaults, `zero_grad(set_to_none=True)`; it runs as a child process driven over a pipe\n"
     << "- sd3 (peer_sd3.py, diffusers SD3Transformer2DModel): `tiny` = the sd3 `tiny` preset (4 blocks, D = 64, two\n"
     << "  dual-attention blocks, qk RMSNorm); `sd3-110m` = SD3.5-medium structure at D = 768 (12 heads x 64), 5\n"
     << "  blocks, block 0 dual, qk RMSNorm, joint_attention_dim 4096, pooled 2048, latent 16 x 32 x 32.\n"
     << "- wan (peer_wan.py, diffusers WanTransformer3DModel, one expert): `tiny` = the wan `tiny` preset (2 blocks,\n"
     << "  2 heads x 32, ffn 128, text 32); `wan-103m` = D = 768 (6 heads x 128), 10 blocks, ffn 3072, UMT5 text\n"
     << "  width 4096, freq_dim 256, latent 16 x 4 x 16 x 16 (frames x height x width); fp32 modulation and\n"
     << "  LayerNorms as diffusers, 3-D RoPE tables in float64.\n"
     << "- qwen_image (peer_qwen_image.py, diffusers QwenImageTransformer2DModel): `tiny` = the qwen_image `tiny`\n"
     << "  preset (2 blocks, 4 heads x 16, RoPE axes 4/6/6, text 32); `qwen-111m` = D = 768 (6 heads x 128, axes\n"
     << "  16/56/56), 5 blocks, text width 3584, latent 16 x 32 x 32 packed 2x2 (the peer packs/unpacks around the\n"
     << "  forward like ditrl's noise_pred); the all-ones text mask is dropped on both sides.\n";
  std::cerr << "wrote " << o.out << "\n";
  return 0;
}
