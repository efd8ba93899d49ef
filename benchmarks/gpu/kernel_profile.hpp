#pragma once

// Where a GPU training step's device time goes: two steps under LibTorch's
// Kineto profiler, each kernel's, memcpy's and memset's device time summed
// by kernel family against the steps' wall time (bench_gpu_step --profile).

#include <functional>
#include <string>

namespace gpu_step {

// A markdown section titled `title`: wall and busy time per step, the table
// by kernel family, the longest kernels.
std::string profile_steps(const std::function<void()>& step, const std::string& title);

}  // namespace gpu_step
