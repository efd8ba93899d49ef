// dist::PhaseTimer on a GPU: the device's time for the kernels launched
// between start() and stop(), which the host's launch loop returns long
// before. SKIPPED where no GPU is visible (gpu_main.cpp).
#include <ditrl/clock.hpp>
#include <ditrl/dist/phase_timer.hpp>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <catch2/catch.hpp>

#include "measured.hpp"

using namespace ditrl;

TEST_CASE("gpu: a phase timer times the kernels on the device and not their launch", "[gpu][timer]") {
  const c10::Device gpu(c10::kCUDA, 0);
  const c10::impl::VirtualGuardImpl guard(c10::kCUDA);
  const at::Tensor a = at::randn({4096, 4096}, at::TensorOptions().device(gpu));
  at::Tensor product = at::mm(a, a);  // warm-up: cuBLAS handle and workspace
  guard.synchronizeDevice(0);

  dist::PhaseTimer timer(gpu);
  const auto start = Clock::now();
  timer.start();
  for (int i = 0; i < 20; ++i) at::mm_out(product, a, a);
  timer.stop();
  const double launched = seconds_since(start);
  const double device = timer.seconds();  // waits for the kernels
  const double finished = seconds_since(start);
  INFO("launch loop " << launched << " s, device " << device << " s, launch to finish " << finished << " s");
  // Measured: printed ("measured:"), not yet recorded from a GPU run.
  ditrl::test::print_measured("device time / launch to finish", device / finished, "> 0.5");
  ditrl::test::print_measured("launch loop / device time", launched / device, "< 0.5");
  CHECK(device > 0.5 * finished);
  CHECK(device <= finished);
  CHECK(launched < 0.5 * device);  // the host timer would have said this
}
