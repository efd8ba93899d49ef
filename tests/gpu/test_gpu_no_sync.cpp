// Work that must not wait for the GPU: LibTorch's sync debug mode, set to
// error, makes any call that synchronises the host with the device (an
// .item(), a copy to or from pageable host memory) throw, so each case runs
// its code under it and then compares the results with the CPU's.
// SKIPPED where no GPU is visible (gpu_main.cpp).
#include <ditrl/dist/reduction.hpp>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <catch2/catch.hpp>

using namespace ditrl;

namespace {

const c10::Device kGpu(c10::kCUDA, 0);

// Host syncs throw while this lives.
class NoHostSync {
 public:
  NoHostSync() : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~NoHostSync() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }
  NoHostSync(const NoHostSync&) = delete;
  NoHostSync& operator=(const NoHostSync&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};

}  // namespace

// The NCCL backend's deterministic reduce-scatter runs this on its
// communication stream right after the all-to-all; a host-built index tensor
// copied to the GPU there blocked the host until the transfer had ended.
TEST_CASE("gpu: the canonical sum of chunks does not synchronise the host", "[gpu][dist][tree]") {
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    INFO("dtype " << c10::toString(dtype));
    const at::Tensor host = (at::randn({4, 1000}, gen, at::TensorOptions().dtype(at::kFloat)) * 100).to(dtype);
    at::Tensor expected = at::empty({1000}, host.options());
    dist::tree_sum_of_chunks(host, expected, /*average=*/false);
    const at::Tensor chunks = host.to(kGpu);
    at::Tensor out = at::empty({1000}, chunks.options());
    {
      const NoHostSync strict;
      CHECK_NOTHROW(dist::tree_sum_of_chunks(chunks, out, /*average=*/false));
    }
    CHECK(at::equal(out.cpu(), expected));
  }
}
