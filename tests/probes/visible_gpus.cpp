// Prints how many GPUs this process sees (dist::visible_gpus(): 0 in a CPU
// build, CUDA_VISIBLE_DEVICES applies), for tests/gpu/skip_without_gpu.sh.
#include <ditrl/dist/device.hpp>

#include <cstdio>

int main() {
  std::printf("%d\n", ditrl::dist::visible_gpus());
  return 0;
}
