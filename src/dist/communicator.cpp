// Pending: the wait handle of an asynchronous collective; the reduction
// rules both backends share.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>

#include <exception>

namespace ditrl::dist {

Pending& Pending::operator=(Pending&& other) noexcept {
  if (this != &other) {
    wait_quietly();
    wait_ = std::move(other.wait_);
    other.wait_ = nullptr;
  }
  return *this;
}

Pending::~Pending() {
  // While an error unwinds a peer may never arrive: the job is aborted by
  // main(), so nothing is waited for.
  if (std::uncaught_exceptions() == 0) wait_quietly();
}

void Pending::wait() {
  if (!wait_) return;
  const std::function<void()> wait = std::move(wait_);
  wait_ = nullptr;
  wait();
}

void Pending::wait_quietly() noexcept {
  try {
    wait();
  } catch (...) {
    // Reported by the next collective on the communicator.
  }
}

void check_reducible(const char* backend, c10::ScalarType dtype, ReduceOp op) {
  if (dtype == at::kBool || at::isComplexType(dtype))
    fail("Communicator({}): cannot reduce {} tensors", backend, c10::toString(dtype));
  if (op == ReduceOp::Avg && !at::isFloatingType(dtype))
    fail("Communicator({}): Avg needs a floating-point tensor (got {})", backend, c10::toString(dtype));
}

void extremum_of_chunks(const at::Tensor& chunks, at::Tensor& output, ReduceOp op) {
  at::Tensor flat = output.view({-1});
  flat.copy_(chunks[0]);
  for (int64_t r = 1; r < chunks.size(0); ++r) {
    if (op == ReduceOp::Max)
      at::maximum_out(flat, flat, chunks[r]);
    else
      at::minimum_out(flat, flat, chunks[r]);
  }
}

}  // namespace ditrl::dist
