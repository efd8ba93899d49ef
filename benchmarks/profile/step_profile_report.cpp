#include "profile/step_profile_report.hpp"

#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/dtype.hpp>

#include "peer/peer_harness.hpp"

#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace step_profile {

namespace {

using Ranked = std::vector<std::pair<std::string, double>>;

template <class Map>
std::vector<std::pair<std::string, typename Map::mapped_type>> largest_first(const Map& m) {
  std::vector<std::pair<std::string, typename Map::mapped_type>> out(m.begin(), m.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string header(const Settings& s, const peer::Case& c, const Measured& m, const std::string& command) {
  return fmt::format(
      "## {} {}, {:.1f} M parameters, {} compute, batch {} x ({} + {} tokens), 1 thread\n\n"
      "- Command: `{}`\n- Date: {}; machine: {}, 1-minute load average {} at the end\n"
      "- LibTorch {}, ShardedParams on one rank ({} attention, {}, {} AdamW); {} profiled steps after {} warm-up "
      "steps: "
      "{:.2f} ms per step "
      "(the profiler adds its own per-op cost)\n\n",
      s.family, c.name, m.params / 1e6, ditrl::precision::dtype_name(s.compute), c.batch, c.image_tokens, c.text_tokens,
      command, peer::utc_now(), peer::cpu_model(), peer::load_average(), TORCH_VERSION,
      name_of(ditrl::models::kAttentionNames, s.attention),
      s.no_recompute ? "no recompute" : "blocks recomputed in backward", s.fused_adamw ? "fused" : "chunked", s.steps,
      s.warmup, 1e3 * (m.seconds / s.steps));
}

// ditrl's and the peer's time per family side by side, then the model's math alone.
std::string peer_table(const Settings& s, const peer::Case& c, const Measured& m, Ranked families) {
  const PeerProfile& peer = *m.peer;
  for (const auto& [name, seconds] : peer.profile.self_seconds)
    if (!m.ditrl.self_seconds.count(name)) families.emplace_back(name, 0.0);
  std::string md = fmt::format(
      "diffusers' {} on the same files ({}, {}; benchmarks/peer/peer_profile.py), profiled the same way: {:.2f} ms per "
      "step, **{:.2f}x ditrl's profiled step**.\n\n"
      "| op family | ditrl ms per step | share | diffusers ms per step | share |\n|---|---|---|---|---|\n",
      std::string(c.config.at("_class_name").as_string()),
      s.compute == at::kBFloat16 ? "fp32 parameters, bf16 autocast" : "fp32", peer.runtime,
      1e3 * peer.profile.step_seconds / s.steps, peer.profile.step_seconds / m.seconds);
  for (const auto& [name, ours] : families) {
    const double theirs = family_seconds(peer.profile, name);
    md += fmt::format("| {} | {:.2f} | {:.1f}% | {:.2f} | {:.1f}% |\n", name, 1e3 * ours / s.steps,
                      100 * ours / m.seconds, 1e3 * theirs / s.steps, 100 * theirs / peer.profile.step_seconds);
  }
  double ours_math = 0, theirs_math = 0;
  for (const char* math : {kGemmFamily, kAttentionFamily, kElementwiseFamily}) {
    ours_math += family_seconds(m.ditrl, math);
    theirs_math += family_seconds(peer.profile, math);
  }
  return md + fmt::format(
                  "\nThe model's math (GEMM + attention + norms / elementwise, the same LibTorch kernels on both "
                  "sides): ditrl {:.2f} ms, diffusers {:.2f} ms per step. A ditrl step of nothing else would be "
                  "**{:.2f}x** diffusers' profiled step.\n",
                  1e3 * ours_math / s.steps, 1e3 * theirs_math / s.steps, peer.profile.step_seconds / ours_math);
}

std::string family_table(const Settings& s, const Measured& m, const Ranked& families) {
  std::string md = "| op family | s per step | share of the step |\n|---|---|---|\n";
  for (const auto& [name, seconds] : families)
    md += fmt::format("| {} | {:.3f} | {:.1f}% |\n", name, seconds / s.steps, 100 * seconds / m.seconds);
  return md;
}

std::string top_ops_and_calls(const Settings& s, const Profile& p) {
  const auto ops = largest_first(p.top_ops);
  std::string md = "\nTop ops by self time (s per step): ";
  for (size_t i = 0; i < std::min<size_t>(12, ops.size()); ++i)
    md += fmt::format("{}{} {:.3f}", i ? ", " : "", ops[i].first, ops[i].second / s.steps);
  const auto calls = largest_first(p.calls);
  int64_t total_calls = 0;
  for (const auto& [name, n] : calls) total_calls += n;
  md += fmt::format("\n\nProfiler events per step (ops and scopes, nested ones included): {}; most called: ",
                    total_calls / s.steps);
  for (size_t i = 0; i < std::min<size_t>(12, calls.size()); ++i)
    md += fmt::format("{}{} {}", i ? ", " : "", calls[i].first, calls[i].second / s.steps);
  return md;
}

std::string gemm_line(const Settings& s, const Measured& m) {
  const Profile& p = m.ditrl;
  const double gemm_seconds = family_seconds(p, kGemmFamily);
  const double achieved = p.gemm_flops / s.steps / (m.seconds / s.steps) / 1e9;
  return fmt::format(
      "\n\nGEMM ceiling ({} `models::linear`, fp32 GEMMs on {}, 1 thread, GFLOP/s by shape m x k x n): {}; ceiling "
      "{:.1f} GFLOP/s. "
      "The step's GEMMs: {:.1f} GFLOP per step in {:.3f} s, {:.1f} GFLOP/s inside GEMMs = {:.0f}% of the "
      "ceiling; over the whole step {:.1f} GFLOP/s = **{:.0f}% of the ceiling**.\n\n",
      ditrl::precision::dtype_name(s.compute), ditrl::precision::cpu_fp32_gemm_name(ditrl::precision::cpu_fp32_gemm()),
      m.ceiling_shapes, m.ceiling_gflops, p.gemm_flops / s.steps / 1e9, gemm_seconds / s.steps,
      gemm_seconds > 0 ? p.gemm_flops / gemm_seconds / 1e9 : 0.0,
      gemm_seconds > 0 ? 100 * p.gemm_flops / gemm_seconds / 1e9 / m.ceiling_gflops : 0.0, achieved,
      100 * achieved / m.ceiling_gflops);
}

}  // namespace

std::string report(const Settings& s, const peer::Case& c, const Measured& m, const std::string& command) {
  const Ranked families = largest_first(m.ditrl.self_seconds);
  std::string md = header(s, c, m, command);
  md += m.peer ? peer_table(s, c, m, families) : family_table(s, m, families);
  return md + top_ops_and_calls(s, m.ditrl) + gemm_line(s, m);
}

}  // namespace step_profile
