#pragma once

// The collectives a training step uses, run on one data communicator with the
// same inputs whatever the backend, so that backends can be held to the same
// bits: reduce-scatter (Sum, Avg), all-reduce (Sum, Max; an odd length, so the
// MPI backend pads), all-gather, all-to-all and broadcast, blocking and
// *_async (a gather and a reduce-scatter in flight at once, waited for in
// reverse order), in fp32, bf16 and fp16. Rank r's values come from its own
// seed and span many magnitudes, so at 4 ranks any other grouping of the
// additions would round differently.

#include <ditrl/dist/communicator.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <map>
#include <string>

namespace ditrl::test {

// Rank `rank`'s values of `dtype`: normal draws times 10^k, k within what
// the dtype holds (fp16 tops out at 65504).
inline at::Tensor spread_values(int rank, int64_t numel, c10::ScalarType dtype) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(2024 + rank));
  const int64_t top = dtype == at::kFloat ? 7 : 3;
  const at::Tensor scale = at::pow(10.0, at::randint(-top, top, {numel}, gen).to(at::kFloat));
  return at::randn({numel}, gen, at::kFloat).mul_(scale).to(dtype);
}

// Every result keyed by what produced it, on the CPU.
using CollectiveResults = std::map<std::string, at::Tensor>;

// Runs the collectives on `comm` with tensors on `device`; every rank calls
// it in the same order.
inline CollectiveResults run_collectives(dist::Communicator& comm, const c10::Device& device) {
  const int n = comm.size(), r = comm.rank();
  CollectiveResults out;
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::TensorOptions on = at::TensorOptions().dtype(dtype).device(device);
    for (const int64_t chunk : {int64_t{1}, int64_t{1000}, int64_t{333333}}) {
      const std::string key = fmt::format("{} chunk {}", c10::toString(dtype), chunk);
      const at::Tensor input = spread_values(r, n * chunk, dtype).to(device);
      for (const auto& [op, name] : {std::pair{dist::ReduceOp::Sum, "sum"}, {dist::ReduceOp::Avg, "avg"}}) {
        at::Tensor mine = at::empty({chunk}, on);
        comm.reduce_scatter(input, mine, op);
        out["reduce_scatter " + std::string(name) + " " + key] = mine.cpu();
      }
      for (const auto& [op, name] : {std::pair{dist::ReduceOp::Sum, "sum"}, {dist::ReduceOp::Max, "max"}}) {
        at::Tensor all = spread_values(r + 7, n * chunk + 1, dtype).to(device);
        comm.all_reduce(all, op);
        out["all_reduce " + std::string(name) + " " + key] = all.cpu();
      }
      at::Tensor gathered = at::empty({n * chunk}, on);
      comm.all_gather(input.narrow(0, 0, chunk), gathered);
      out["all_gather " + key] = gathered.cpu();
      at::Tensor swapped = at::empty({n * chunk}, on);
      comm.all_to_all(input, swapped);
      out["all_to_all " + key] = swapped.cpu();
      at::Tensor sent = input.narrow(0, 0, chunk).clone();
      comm.broadcast(sent, n - 1);
      out["broadcast " + key] = sent.cpu();

      at::Tensor async_gathered = at::empty({n * chunk}, on), async_mine = at::empty({chunk}, on);
      dist::Pending gather = comm.all_gather_async(input.narrow(0, chunk * (n - 1), chunk), async_gathered);
      dist::Pending reduce = comm.reduce_scatter_async(input, async_mine, dist::ReduceOp::Sum);
      // The caller computes meanwhile (its result differs by device and is not compared).
      const at::Tensor busy = input.to(at::kFloat).mul(2.0).sum();
      reduce.wait();
      gather.wait();
      out["reduce_scatter_async sum " + key] = async_mine.cpu();
      out["all_gather_async " + key] = async_gathered.cpu();
      (void)busy;
    }
  }
  return out;
}

// The keys whose tensors differ in a bit (or are missing from `b`).
inline std::string differing(const CollectiveResults& a, const CollectiveResults& b) {
  std::string listed;
  for (const auto& [key, tensor] : a) {
    const auto other = b.find(key);
    const bool same = other != b.end() && tensor.scalar_type() == other->second.scalar_type() &&
                      tensor.sizes() == other->second.sizes() &&
                      at::equal(tensor.contiguous().view(at::kByte), other->second.contiguous().view(at::kByte));
    if (!same) listed += key + "\n";
  }
  return listed;
}

}  // namespace ditrl::test
