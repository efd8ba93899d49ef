// Pending: the wait handle of an asynchronous collective; the reduction
// rules and the canonical summation tree both backends share.

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

int64_t tree_split(int64_t n) {
  int64_t p = 1;
  while (p * 2 < n) p *= 2;
  return p;
}

int64_t bit_reversed(int64_t value, int bits) {
  int64_t out = 0;
  for (int b = 0; b < bits; ++b) out |= ((value >> b) & 1) << (bits - 1 - b);
  return out;
}

std::vector<int> chunk_leaf_order(int ranks) {
  std::vector<int> order(static_cast<size_t>(ranks));
  int bits = 0;
  while ((1 << bits) < ranks) ++bits;
  const bool power_of_two = (1 << bits) == ranks;
  for (int p = 0; p < ranks; ++p)
    order[static_cast<size_t>(p)] = power_of_two ? static_cast<int>(bit_reversed(p, bits)) : p;
  return order;
}

namespace {

// Leaf p is chunks[order[p]], a fresh copy in the accumulation dtype.
at::Tensor tree_sum(const at::Tensor& chunks, const std::vector<int>& order, c10::ScalarType acc_dtype, size_t lo,
                    size_t hi) {
  if (hi - lo == 1) return chunks[order[lo]].to(acc_dtype, /*non_blocking=*/false, /*copy=*/true);
  const auto p = static_cast<size_t>(tree_split(static_cast<int64_t>(hi - lo)));
  return tree_sum(chunks, order, acc_dtype, lo, lo + p).add_(tree_sum(chunks, order, acc_dtype, lo + p, hi));
}

}  // namespace

void tree_sum_of_chunks(const at::Tensor& chunks, at::Tensor& output, bool average) {
  const int ranks = static_cast<int>(chunks.size(0));
  const std::vector<int> order = chunk_leaf_order(ranks);
  const c10::ScalarType dtype = output.scalar_type();
  const c10::ScalarType acc_dtype = dtype == at::kBFloat16 || dtype == at::kHalf ? at::kFloat : dtype;
  // The leaves are picked by host indices (views), not by an index tensor:
  // on CUDA that tensor's copy from pageable host memory synchronises the
  // stream, and the NCCL backend runs this on its communication stream
  // right after the all-to-all, so every deterministic reduce-scatter would
  // block the host until its transfer ended (no overlap with the backward,
  // and a dead peer would hold the host there, holding the communicator's lock).
  at::Tensor sum = tree_sum(chunks, order, acc_dtype, 0, static_cast<size_t>(ranks));
  if (average) sum.div_(static_cast<double>(ranks));
  output.view({-1}).copy_(sum);
}

}  // namespace ditrl::dist
