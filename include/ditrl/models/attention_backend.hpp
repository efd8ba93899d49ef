#pragma once

// The attention kernels a family can run (models/attention.hpp), as the
// deck's precision.attention and `ditrl forward --attention` name them.
// Header-only: the deck reader (config/) parses the name into it.

#include <ditrl/name_table.hpp>

namespace ditrl::models {

enum class AttentionBackend {
  Math,       // portable and deterministic; half inputs computed in fp32
  Flash,      // LibTorch's fused SDPA kernels: flash (CPU, and CUDA without a mask),
  Efficient,  // memory-efficient (CUDA),
  Cudnn,      // cuDNN (CUDA); exactly the chosen one is enabled (no fallback)
};

inline constexpr NameTable<AttentionBackend, 4> kAttentionNames{{{"math", AttentionBackend::Math},
                                                                 {"flash", AttentionBackend::Flash},
                                                                 {"efficient", AttentionBackend::Efficient},
                                                                 {"cudnn", AttentionBackend::Cudnn}}};

// The backends a CPU-only build has (the others run on CUDA only).
constexpr bool runs_on_cpu(AttentionBackend backend) {
  return backend == AttentionBackend::Math || backend == AttentionBackend::Flash;
}

}  // namespace ditrl::models
