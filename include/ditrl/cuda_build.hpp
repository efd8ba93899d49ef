#pragma once

// What this binary was built with (fixed at configure time).

namespace ditrl {

// -DDITRL_CUDA=ON: CUDA LibTorch, the NCCL communicator and GPU attention.
constexpr bool kCudaBuild =
#ifdef DITRL_CUDA
    true;
#else
    false;
#endif

}  // namespace ditrl
