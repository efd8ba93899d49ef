// Training-step speed of ditrl's LTX-2.3 video transformer against the same
// model in Python PyTorch eager (benchmarks/peer/peer_ltx.py): forward + backward +
// AdamW step on the same weights (one safetensors file both sides load), the
// same inputs and the same number of intra-op threads, for the tiny preset
// (framework overhead dominates) and a ~100M-parameter LTX-2.3-style config
// (GEMMs dominate). Same method as benchmarks/peer/peer_forward.cpp (SD3). Writes
// benchmarks/results/peer_forward_ltx.md.

#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/weights.hpp>

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
#include <thread>

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace ditrl;

namespace {

struct Case {
  std::string name;
  models::LtxConfig config;
  int64_t batch, frames, height, width, text_tokens;
  int warmup, rounds, steps_per_round;
};

// ~100M parameters: the LTX-2.3 video stream (gated attention, prompt AdaLN,
// 9-row tables, 128 latent channels) at width 768 (12 heads x 64), 10 blocks.
models::LtxConfig config_100m() {
  models::LtxConfig c = models::LtxConfig::preset("ltx-2.3-video");
  c.num_attention_heads = 12;
  c.attention_head_dim = 64;
  c.cross_attention_dim = 768;
  c.num_layers = 10;
  return c;
}

// The checkpoint-metadata format both sides read ({"transformer": {...}}).
void write_config(const models::LtxConfig& c, const std::string& path) {
  json::array max_pos;
  for (int64_t p : c.positional_embedding_max_pos) max_pos.push_back(p);
  const json::object transformer{{"num_attention_heads", c.num_attention_heads},
                                 {"attention_head_dim", c.attention_head_dim},
                                 {"in_channels", c.in_channels},
                                 {"out_channels", c.out_channels},
                                 {"num_layers", c.num_layers},
                                 {"cross_attention_dim", c.cross_attention_dim},
                                 {"norm_eps", c.norm_eps},
                                 {"positional_embedding_theta", c.positional_embedding_theta},
                                 {"positional_embedding_max_pos", max_pos},
                                 {"timestep_scale_multiplier", c.timestep_scale_multiplier},
                                 {"rope_type", c.rope_type},
                                 {"frequencies_precision", c.double_precision_rope ? "float64" : "float32"},
                                 {"apply_gated_attention", c.apply_gated_attention},
                                 {"cross_attention_adaln", c.cross_attention_adaln},
                                 {"use_prompt_adaln_single", c.use_prompt_adaln_single},
                                 {"caption_proj_before_connector", !c.caption_projection},
                                 {"caption_channels", c.caption_channels},
                                 {"ff_bias", c.ff_bias}};
  std::ofstream(path) << json::serialize(json::object{{"transformer", transformer}});
}

// ditrl's side: the video-only model loaded from the shared files, LibTorch's AdamW.
class DitrlTrainer {
 public:
  DitrlTrainer(const models::LtxConfig& config, const std::string& weights, const std::string& inputs) {
    model_ = std::make_shared<models::LTX>(config, models::FamilyOptions{});
    models::load_weights(*model_, io::Checkpoint(weights));
    optimizer_ = std::make_unique<torch::optim::AdamW>(model_->parameters(), torch::optim::AdamWOptions(1e-4));
    const io::SafetensorsFile file(inputs);
    video_.latent = file.get("latent");
    video_.sigma = file.get("sigma");
    video_.timesteps = file.get("timesteps");
    video_.positions = file.get("positions");
    video_.context = file.get("context");
    target_ = file.get("target");
    for (const auto& p : model_->parameters()) params += p.numel();
  }

  peer::Timing run(int steps) {
    return peer::train_steps(*model_, *optimizer_, steps,
                             [&] { return at::mse_loss(model_->forward(video_, nullptr, {}).first, target_); });
  }

  int64_t params = 0;

 private:
  std::shared_ptr<models::LTX> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  models::LtxModality video_;
  at::Tensor target_;
};

struct Row {
  std::string config, malloc_mode, tokens;
  int threads;
  double params_m;
  peer::Summary s;
};

void prepare_case(const Case& c, const std::string& dir) {
  fs::create_directories(dir);
  write_config(c.config, dir + "/config.json");
  models::LTX model(c.config, models::FamilyOptions{});
  models::init_parameters(model, 1234);
  io::write_safetensors(dir + "/weights.safetensors", models::state_tensors(model));
  at::manual_seed(99);
  const int64_t tokens = c.frames * c.height * c.width;
  io::write_safetensors(
      dir + "/inputs.safetensors",
      {{"latent", at::randn({c.batch, tokens, c.config.in_channels})},
       {"sigma", at::linspace(0.2, 0.9, c.batch)},
       {"timesteps", at::linspace(0.2, 0.9, c.batch).view({c.batch, 1})},
       {"positions", models::ltx_video_positions(c.batch, c.frames, c.height, c.width, 24.0, at::kCPU)},
       {"context", at::randn({c.batch, c.text_tokens, c.config.context_in_dim()})},
       {"target", at::randn({c.batch, tokens, c.config.out_channels})}});
}

Row measure(const Case& c, const std::string& dir, int threads, bool tuned, const std::string& python,
            const std::string& script) {
  at::set_num_threads(threads);
  const std::string config = dir + "/config.json", weights = dir + "/weights.safetensors",
                    inputs = dir + "/inputs.safetensors";
  DitrlTrainer ours(c.config, weights, inputs);
  peer::PythonPeer python_side({python, script, "--config", config, "--weights", weights, "--inputs", inputs,
                                "--threads", std::to_string(threads)},
                               tuned);
  const peer::Comparison cmp = peer::alternate(ours, python_side, c.warmup, c.rounds, c.steps_per_round);
  Row row{c.name,
          tuned ? "tuned" : "default",
          fmt::format("{} x ({} + {})", c.batch, c.frames * c.height * c.width, c.text_tokens),
          threads,
          ours.params / 1e6,
          peer::summarize(cmp)};
  std::cerr << fmt::format("{} threads={} malloc={}: {}\n", row.config, threads, row.malloc_mode, peer::speed(row.s));
  return row;
}

// The tiny preset at batch 1 and 2 and the ~100M config.
std::vector<Case> ltx_cases(const peer::Options& o) {
  const models::LtxConfig tiny = models::LtxConfig::preset("tiny-video");
  return {{"tiny", tiny, 1, 2, 4, 4, 8, 10, o.tiny_rounds, 10},
          {"tiny", tiny, 2, 3, 8, 8, 8, 10, o.tiny_rounds, 10},
          {"ltx-100m", config_100m(), 2, 4, 8, 8, 128, 3, o.big_rounds, 1}};
}

// Every case and thread count, in each malloc mode.
std::vector<Row> measure_all(const peer::Options& o, const std::vector<Case>& cases) {
  // Not __FILE__: ccache's CCACHE_BASEDIR makes that path relative to the build directory.
  const std::string script = (fs::path(DITRL_BENCHMARKS_DIR) / "peer" / "peer_ltx.py").string();
  std::vector<Row> rows;
  peer::for_each_malloc_mode(o.skip_tuned, [&](bool tuned) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].rounds <= 0) continue;
      const std::string dir = o.work + "/case" + std::to_string(i);
      if (!tuned) prepare_case(cases[i], dir);
      for (int threads : o.thread_counts) rows.push_back(measure(cases[i], dir, threads, tuned, o.python, script));
    }
  });
  return rows;
}

void write_report(std::ostream& md, const peer::Options& o, const std::vector<Row>& rows, const std::string& command,
                  const std::string& load_at_start) {
  md << "# peer_forward_ltx: ditrl vs Python PyTorch eager, LTX-2.3 video transformer training step\n\n"
     << "Forward + backward + AdamW step (lr 1e-4, default betas/eps/weight decay on both sides) of the LTX-2.3\n"
     << "video stream (ltx_core's LTXModel with audio = None), MSE loss of the velocity against a fixed target,\n"
     << "the same weights read from one safetensors file by both sides, the same inputs (patchified latent\n"
     << "tokens, sigma, one AdaLN row per sample, pixel/second RoPE positions, text features) and the same\n"
     << "number of intra-op threads. Method as benchmarks/results/peer_forward.md: warm-up steps, then the two\n"
     << "sides alternate rounds so both see the same background load; median and fastest step; speedup =\n"
     << "median Python time / median ditrl time (> 1: ditrl is faster); the loss columns compare the two\n"
     << "sides' losses at the first and the last step (the peer is the same model in the same op order).\n"
     << peer::malloc_modes_text() << "\n`page faults/step`: median minor page faults per step in each process.\n\n"
     << "| config | params | batch x (video + text tokens) | threads | malloc | timed steps | ditrl ms/step | "
        "Python ms/step | speedup | min ditrl / Python ms | page faults/step ditrl / Python | "
        "rel. loss gap first / last step |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows)
    md << fmt::format("| {} | {:.1f} M | {} | {} | {} | {} |\n", r.config, r.params_m, r.tokens, r.threads,
                      r.malloc_mode, peer::cells(r.s));
  md << "\n- Command: `" << command << "`\n"
     << "- Date: " << peer::utc_now() << "\n"
     << "- Machine: " << peer::cpu_model() << ", " << std::thread::hardware_concurrency()
     << " hardware threads; 1-minute load average " << load_at_start << " at the start, " << peer::load_average()
     << " at the end (anything above 0 is other work sharing the cores); BLAS " << peer::blas_library() << "\n"
     << "- ditrl: LibTorch " << TORCH_VERSION << " (C++), `math` attention, `torch::optim::AdamW`, "
     << "models::LTX::forward (video only)\n"
     << "- Python peer: " << o.python << ", torch " << peer::python_torch_version(o.python)
     << " (the same LibTorch build), benchmarks/peer/peer_ltx.py: ltx_core's video stream written with plain\n"
     << "  torch ops in ltx_core's op order (nn.Linear, ATen's composite rms_norm, gated attention, split RoPE\n"
     << "  with the numpy float64 frequency grid, math attention since torch 1.13 has no SDPA), weights loaded\n"
     << "  with load_state_dict(strict=True) through a small safetensors reader, `torch.optim.AdamW` with its\n"
     << "  defaults, `zero_grad(set_to_none=True)`; it runs as a child process driven over a pipe\n"
     << "- Configs: `tiny` = the ltx `tiny-video` preset (2 blocks, D = 64, 4 heads, 2.3 flags, 16 latent\n"
     << "  channels); `ltx-100m` = the LTX-2.3 video stream at D = 768 (12 heads x 64), 10 blocks, 128 latent\n"
     << "  channels, latent grid 4 x 8 x 8.\n";
}

}  // namespace

int main(int argc, char** argv) {
  peer::Options o("peer_forward_ltx");
  CLI::App app{"ditrl vs Python PyTorch eager: LTX-2.3 video transformer forward+backward+AdamW step time"};
  o.add_to(app);
  CLI11_PARSE(app, argc, argv);
  o.sort_threads();
  const std::vector<Case> cases = ltx_cases(o);
  const std::string load_at_start = peer::load_average();
  const std::vector<Row> rows = measure_all(o, cases);
  std::ofstream md(o.out);
  write_report(md, o, rows, peer::command_line(argc, argv), load_at_start);
  std::cerr << "wrote " << o.out << "\n";
  return 0;
}
