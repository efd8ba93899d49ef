#include <ditrl/error.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <fstream>

namespace ditrl::precision {

namespace {

bool intel_cpu() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("vendor_id", 0) == 0) return line.find("GenuineIntel") != std::string::npos;
  return false;
}

CpuFp32Gemm auto_mode(bool deterministic) {
  static const bool onednn_faster = onednn_linear_available() && !intel_cpu();
  return onednn_faster && !deterministic ? CpuFp32Gemm::Onednn : CpuFp32Gemm::Blas;
}

std::atomic<int> chosen{-1};  // -1: not set, the auto choice

}  // namespace

bool onednn_linear_available() {
  static const bool available = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""}).has_value();
  return available;
}

CpuFp32Gemm parse_cpu_fp32_gemm(const std::string& name, bool deterministic) {
  if (name == "auto") return auto_mode(deterministic);
  if (name == "blas") return CpuFp32Gemm::Blas;
  if (name == "onednn") {
    if (!onednn_linear_available()) fail("cpu_fp32_gemm = 'onednn': this LibTorch was built without oneDNN");
    return CpuFp32Gemm::Onednn;
  }
  fail("unknown cpu_fp32_gemm '{}': expected auto, blas or onednn", name);
}

std::string cpu_fp32_gemm_name(CpuFp32Gemm mode) {
  return mode == CpuFp32Gemm::Onednn ? "onednn" : "blas";
}

void set_cpu_fp32_gemm(CpuFp32Gemm mode) {
  chosen = static_cast<int>(mode);
}

CpuFp32Gemm cpu_fp32_gemm() {
  const int mode = chosen;
  return mode < 0 ? auto_mode(false) : static_cast<CpuFp32Gemm>(mode);
}

}  // namespace ditrl::precision
