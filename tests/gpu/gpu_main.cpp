// Catch2 runner for the `gpu` suite: where this process sees no GPU, every
// case reports SKIPPED (exit 77, CTest's SKIP_RETURN_CODE) with the reason;
// listing the cases (catch_discover_tests at build time) works anywhere. A
// CUDA build without LibTorch's CUDA kernels fails every case, GPU or not:
// that is a broken link, which no GPU run would get past.
#define CATCH_CONFIG_RUNNER
#include <ditrl/cuda_build.hpp>
#include <ditrl/dist/device.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing) {
    if (ditrl::kCudaBuild && !ditrl::dist::cuda_kernels_loaded()) {
      std::printf("FAILED: this CUDA build has no LibTorch CUDA kernels (libtorch_cuda.so is not loaded)\n");
      return 1;
    }
    const int gpus = ditrl::dist::visible_gpus();
    if (gpus < 1) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      std::printf("SKIPPED: no GPU visible to this process (%s%s%s)\n", ditrl::kCudaBuild ? "" : "CPU-only build; ",
                  visible ? "CUDA_VISIBLE_DEVICES=" : "CUDA_VISIBLE_DEVICES unset", visible ? visible : "");
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
