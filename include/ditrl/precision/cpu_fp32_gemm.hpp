#pragma once

// Which kernel runs fp32 GEMMs (the layers' linear projections) on a CPU
// (the deck's precision.cpu_fp32_gemm). LibTorch calls its BLAS (MKL in the
// PyPI wheel), whose fast code paths are Intel's own: on an AMD EPYC with
// AVX-512 a linear layer's GEMMs at 768 rows ran at 104-120 GFLOP/s on one
// thread, and at 140-266 on oneDNN's fp32 matmul, which dispatches on the
// instruction set alone (benchmarks/results/fp32_gemm.md). Nothing pins
// oneDNN's kernel choice across machines the way MKL_CBWR pins MKL's:
// deterministic runs keep the BLAS. Both are fp32 GEMMs with fp32
// sums, in different orders. CUDA tensors always take LibTorch's kernels.

#include <string>

namespace ditrl::precision {

enum class CpuFp32Gemm { Blas, Onednn };

// "auto" (oneDNN unless the run is deterministic, the CPU is Intel's or
// LibTorch has no oneDNN), "blas" or "onednn" (an error without oneDNN).
CpuFp32Gemm parse_cpu_fp32_gemm(const std::string& name, bool deterministic);
std::string cpu_fp32_gemm_name(CpuFp32Gemm mode);

// Whether this LibTorch registers oneDNN's linear (mkldnn::_linear_pointwise).
bool onednn_linear_available();

// Process-wide; until set, the "auto" choice of a run that is not deterministic.
void set_cpu_fp32_gemm(CpuFp32Gemm mode);
CpuFp32Gemm cpu_fp32_gemm();

}  // namespace ditrl::precision
