#pragma once

// How bf16 / fp16 GEMMs run on a CPU (the deck's precision.cpu_half_gemm).
// LibTorch runs them with oneDNN, whose kernels are fast only where the CPU
// has bf16 dot-product instructions (AVX512-BF16, AMX); elsewhere (AVX2,
// AVX-512 without BF16) they are several times slower than the fp32 GEMM
// (measured 7-8x on an AMD EPYC with AVX2). There the layers widen instead
// (models/widened_gemm.hpp): a half-precision GEMM with fp32 accumulation,
// computed by the fp32 GEMM. CUDA tensors always take LibTorch's kernels.

#include <string>

namespace ditrl::precision {

enum class CpuHalfGemm { Native, Widened };

// "auto" (widened unless this CPU has AVX512-BF16 or AMX-BF16), "native" or
// "widened".
CpuHalfGemm parse_cpu_half_gemm(const std::string& name);
std::string cpu_half_gemm_name(CpuHalfGemm mode);

// Process-wide; until set, the "auto" choice for this CPU.
void set_cpu_half_gemm(CpuHalfGemm mode);
CpuHalfGemm cpu_half_gemm();

}  // namespace ditrl::precision
