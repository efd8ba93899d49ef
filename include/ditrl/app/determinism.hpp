#pragma once

// Deterministic mode ([run] deterministic = true) pins what makes CPU kernels
// differ between runs and between machines of one kind with other CPU
// models: the intra-op thread count (OMP_NUM_THREADS, MKL_NUM_THREADS),
// ATen's CPU capability (ATEN_CPU_CAPABILITY=avx2) and MKL's code path
// (MKL_CBWR=AVX2,STRICT, its conditional numerical reproducibility), which
// together fix every fp32 kernel. STRICT because MKL's default CNR mode
// leaves a GEMM's result free to depend on its operands' addresses: on an
// Intel Xeon with AMX, `MKL_CBWR=AVX2` gave the training forward other bits
// than the rollout's on the same shapes, and 2 ranks other bits than 1
// (docs/determinism-and-parity.md). The libraries read these when they load, so a
// process started without them re-executes itself with them set (before MPI
// starts); values the user set are kept. oneDNN's bf16 matmuls are not
// pinned, so bf16 forwards stay bitwise only on one CPU model.
//
// On CUDA it also makes LibTorch pick deterministic kernels only (an op that
// has none is an error), cuBLAS a fixed workspace (CUBLAS_WORKSPACE_CONFIG
// =:4096:8, read when cuBLAS starts, so it is pinned with the CPU ones),
// no TF32, no reduced-precision bf16/fp16 accumulation in matmuls, and no
// cuDNN autotuning.

#include <string>

namespace ditrl::app {

// Returns only when the environment already pins the kernels.
void pin_cpu_kernels(int threads);

// LibTorch's CUDA switches for deterministic mode (process-wide).
void pin_gpu_kernels();

// Warns when the user's own MKL_CBWR (kept over the pin) is not STRICT.
void warn_on_weaker_pins();

// The pins in effect and the CPU capability ATen dispatches to, for the log.
std::string cpu_kernel_pins();

}  // namespace ditrl::app
