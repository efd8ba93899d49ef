#include <ditrl/error.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <ATen/cpu/Utils.h>

#include <atomic>

namespace ditrl::precision {

namespace {

bool has_half_dot_products() {
  const auto caps = at::cpu::get_cpu_capabilities();
  const auto flag = [&caps](const char* name) {
    const auto it = caps.find(name);
    return it != caps.end() && it->second.isBool() && it->second.toBool();
  };
  return flag("avx512_bf16") || flag("amx_bf16");
}

CpuHalfGemm auto_mode() {
  static const CpuHalfGemm mode = has_half_dot_products() ? CpuHalfGemm::Native : CpuHalfGemm::Widened;
  return mode;
}

std::atomic<int> chosen{-1};  // -1: not set, the auto choice

}  // namespace

CpuHalfGemm parse_cpu_half_gemm(const std::string& name) {
  if (name == "auto") return auto_mode();
  if (name == "native") return CpuHalfGemm::Native;
  if (name == "widened") return CpuHalfGemm::Widened;
  fail("unknown cpu_half_gemm '{}': expected auto, native or widened", name);
}

std::string cpu_half_gemm_name(CpuHalfGemm mode) {
  return mode == CpuHalfGemm::Native ? "native" : "widened";
}

void set_cpu_half_gemm(CpuHalfGemm mode) {
  chosen = static_cast<int>(mode);
}

CpuHalfGemm cpu_half_gemm() {
  const int mode = chosen;
  return mode < 0 ? auto_mode() : static_cast<CpuHalfGemm>(mode);
}

}  // namespace ditrl::precision
