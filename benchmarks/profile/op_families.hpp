#pragma once

// bench_step_profile's attribution: each profiled op's self time (its
// duration minus its children's, per thread) goes to one op family by the
// op's name: GEMM (mm, addmm, bmm, convolutions), attention (softmax and its
// backward, masked fill), copies (copy_, _to_copy, cat, clone, ...),
// allocation (empty*), norms / elementwise (every other aten op), optimizer
// (anything under the optimizer scope), framework (autograd engine and scope
// self time, and the step's time no op covers). ditrl's events and the
// diffusers peer's go through the same rules.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace step_profile {

// The record_function scope both sides run their optimizer step in.
inline constexpr char kOptimizerScope[] = "ditrl::adamw_step";

inline constexpr char kGemmFamily[] = "GEMM (mm, addmm, bmm, conv)";
inline constexpr char kAttentionFamily[] = "attention softmax / mask";
inline constexpr char kElementwiseFamily[] = "norms / elementwise";
inline constexpr char kFramework[] = "framework (autograd engine, scopes, the peer's interpreter)";

struct Op {
  std::string name;
  uint64_t start, end, thread;
  uint64_t flops;
};

struct Profile {
  std::map<std::string, double> self_seconds;  // per family
  double gemm_flops = 0;
  double step_seconds = 0;
  std::map<std::string, double> top_ops;  // self seconds per op name
  std::map<std::string, int64_t> calls;   // events per op name (nested ops included)
};

// Self time per op family from the profiler's CPU events of `step_seconds` of steps.
Profile attribute(const std::vector<Op>& events, double step_seconds);

// A family's self seconds; 0 when it has none.
double family_seconds(const Profile& p, const std::string& family);

}  // namespace step_profile
