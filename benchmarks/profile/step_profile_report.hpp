#pragma once

// The markdown section bench_step_profile prints (and appends to --out): the
// step's time per op family (beside the diffusers peer's with --peer), its top
// ops and event counts, and its GEMMs against the measured GEMM ceiling.

#include <ditrl/models/attention_backend.hpp>

#include "peer/peer_cases.hpp"
#include "profile/op_families.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace step_profile {

struct Settings {
  std::string family = "sd3", case_name = "big";
  c10::ScalarType compute = at::kFloat;
  ditrl::models::AttentionBackend attention = ditrl::models::AttentionBackend::Math;
  std::string work = "/tmp/ditrl_step_profile", out, trace, python = DITRL_PYTHON;
  int steps = 2, warmup = 2;
  bool no_recompute = false, fused_adamw = false, with_peer = false;
};

struct PeerProfile {
  Profile profile;
  std::string runtime;  // its malloc, torch and diffusers versions
};

struct Measured {
  int64_t params = 0;
  double seconds = 0;  // wall time of the profiled steps
  Profile ditrl;
  std::optional<PeerProfile> peer;
  double ceiling_gflops = 0;
  std::string ceiling_shapes;  // "m x k x n GFLOP/s" of each timed shape
};

std::string report(const Settings& s, const peer::Case& c, const Measured& m, const std::string& command);

}  // namespace step_profile
