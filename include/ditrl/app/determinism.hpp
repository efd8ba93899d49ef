#pragma once

// Deterministic mode ([run] deterministic = true) pins what makes CPU kernels
// differ between runs and between machines of one kind with other CPU
// models: the intra-op thread count, ATen's CPU capability
// (ATEN_CPU_CAPABILITY=avx2), OpenBLAS's kernel family
// (OPENBLAS_CORETYPE=Haswell) and oneDNN's instruction set
// (DNNL_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA=AVX2). The libraries read these when
// they load, so a process started without them re-executes itself with them
// set (before MPI starts); values the user set are kept.

#include <string>

namespace ditrl::app {

// Returns only when the environment already pins the kernels.
void pin_cpu_kernels(int threads);

// The pins in effect, for the log.
std::string cpu_kernel_pins();

}  // namespace ditrl::app
