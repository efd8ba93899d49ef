// ditrl-mpi-ranks: 1 2 4
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

namespace ditrl {
namespace {

using Catch::Matchers::Contains;

const std::vector<c10::ScalarType> kAllDtypes{at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                              at::kInt,   at::kLong,   at::kByte};
const std::vector<c10::ScalarType> kFloatDtypes{at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

// What rank r contributes: deterministic, different per rank, with values
// whose fp32 sums depend on the order of addition.
at::Tensor contribution(int r, int64_t n, c10::ScalarType dtype) {
  at::Tensor base = at::arange(n, at::kDouble).mul_(0.37).add_(r * 1.7).sin_().mul_(1000.0 / (r + 1));
  if (at::isFloatingType(dtype)) return base.to(dtype);
  return base.abs_().fmod_(100).to(dtype);  // small non-negative integers (uint8-safe)
}

// The documented reduction order: the canonical tree over the chunks in
// chunk_leaf_order (2 ranks: c0 + c1; 4 ranks: (c0 + c2) + (c1 + c3)),
// accumulating in fp32 for fp32/bf16/fp16, rounded once to the output dtype.
at::Tensor tree_of(const std::vector<at::Tensor>& leaves, size_t lo, size_t hi) {
  if (hi - lo == 1) return leaves[lo];
  const size_t split = lo + static_cast<size_t>(dist::tree_split(static_cast<int64_t>(hi - lo)));
  return tree_of(leaves, lo, split) + tree_of(leaves, split, hi);
}

at::Tensor expected_reduction(const std::vector<at::Tensor>& chunks, dist::ReduceOp op) {
  const c10::ScalarType dtype = chunks[0].scalar_type();
  const c10::ScalarType acc_dtype = dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
  if (op == dist::ReduceOp::Max || op == dist::ReduceOp::Min) {
    at::Tensor acc = chunks[0].to(acc_dtype);
    for (size_t r = 1; r < chunks.size(); ++r)
      acc = op == dist::ReduceOp::Max ? at::maximum(acc, chunks[r].to(acc_dtype))
                                      : at::minimum(acc, chunks[r].to(acc_dtype));
    return acc.to(dtype);
  }
  std::vector<at::Tensor> leaves;
  for (int r : dist::chunk_leaf_order(static_cast<int>(chunks.size())))
    leaves.push_back(chunks[static_cast<size_t>(r)].to(acc_dtype));
  at::Tensor acc = tree_of(leaves, 0, leaves.size());
  if (op == dist::ReduceOp::Avg) acc = acc / static_cast<double>(chunks.size());
  return acc.to(dtype);
}

}  // namespace

TEST_CASE("communicator: all_gather moves every dtype bit-exactly in rank order", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  for (const c10::ScalarType dtype : kAllDtypes) {
    INFO("dtype " << c10::toString(dtype));
    const int64_t count = 1001;  // odd: no alignment luck
    at::Tensor output = at::empty({n * count}, at::TensorOptions().dtype(dtype));
    comm->all_gather(contribution(comm->rank(), count, dtype), output);
    for (int r = 0; r < n; ++r) CHECK(at::equal(output.narrow(0, r * count, count), contribution(r, count, dtype)));
  }
}

TEST_CASE("communicator: reduce_scatter sums in the canonical tree with fp32 accumulation for every dtype", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  const int64_t chunk = 777;
  for (const c10::ScalarType dtype : kAllDtypes) {
    for (const dist::ReduceOp op :
         {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max, dist::ReduceOp::Min}) {
      if (op == dist::ReduceOp::Avg && !at::isFloatingType(dtype)) continue;
      INFO("dtype " << c10::toString(dtype) << " op " << static_cast<int>(op));
      at::Tensor output = at::empty({chunk}, at::TensorOptions().dtype(dtype));
      comm->reduce_scatter(contribution(comm->rank(), n * chunk, dtype), output, op);
      std::vector<at::Tensor> mine;
      for (int r = 0; r < n; ++r)
        mine.push_back(contribution(r, n * chunk, dtype).narrow(0, comm->rank() * chunk, chunk));
      CHECK(at::equal(output, expected_reduction(mine, op)));
    }
  }
}

TEST_CASE("communicator: bf16 reductions accumulate in fp32 and round once", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  // Many small terms: summed in bf16 step by step they would lose most of
  // their bits; accumulated in fp32 they survive to the final rounding.
  at::Tensor t = at::full({4096}, 1.0 + comm->rank() / 128.0, at::kBFloat16);
  comm->all_reduce(t, dist::ReduceOp::Sum);
  double exact = 0;
  for (int r = 0; r < n; ++r) exact += at::full({1}, 1.0 + r / 128.0, at::kBFloat16).item<double>();
  CHECK(at::equal(t, at::full({4096}, exact, at::kFloat).to(at::kBFloat16)));
  // Repeatable: the same inputs give the same bits on every call.
  at::Tensor a = contribution(comm->rank(), 4096 * n, at::kBFloat16), b = a.clone();
  comm->all_reduce(a, dist::ReduceOp::Avg);
  comm->all_reduce(b, dist::ReduceOp::Avg);
  CHECK(at::equal(a, b));
}

TEST_CASE("communicator: all_reduce of any size / broadcast / barrier", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  for (const c10::ScalarType dtype : kFloatDtypes) {
    for (const int64_t count : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{4099}}) {
      INFO("dtype " << c10::toString(dtype) << " count " << count);
      at::Tensor t = contribution(comm->rank(), count, dtype).reshape({count, 1});
      comm->all_reduce(t, dist::ReduceOp::Sum);
      std::vector<at::Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(contribution(r, count, dtype).reshape({count, 1}));
      CHECK(at::equal(t, expected_reduction(all, dist::ReduceOp::Sum)));
    }
  }
  at::Tensor scalar = at::full({}, static_cast<int64_t>(comm->rank() + 1), at::kLong);
  comm->all_reduce(scalar, dist::ReduceOp::Max);
  CHECK(scalar.item<int64_t>() == n);

  for (const c10::ScalarType dtype : kAllDtypes) {
    at::Tensor t =
        comm->rank() == n - 1 ? contribution(42, 333, dtype) : at::zeros({333}, at::TensorOptions().dtype(dtype));
    comm->broadcast(t, n - 1);
    CHECK(at::equal(t, contribution(42, 333, dtype)));
  }
  comm->barrier();
}

TEST_CASE("communicator: split makes sub-communicators by color / ordered by key", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  // Even and odd ranks, reversed order inside each group.
  auto sub = comm->split(comm->rank() % 2, -comm->rank());
  const int members = (n + 1 - comm->rank() % 2) / 2;
  CHECK(sub->size() == members);
  at::Tensor ranks = at::empty({sub->size()}, at::kInt);
  sub->all_gather(at::full({1}, comm->rank(), at::kInt), ranks);
  for (int i = 0; i < sub->size(); ++i) {
    CHECK(ranks[i].item<int>() % 2 == comm->rank() % 2);
    if (i > 0) CHECK(ranks[i].item<int>() < ranks[i - 1].item<int>());
  }
  CHECK(ranks[sub->rank()].item<int>() == comm->rank());
  // A sub-communicator's collectives do not mix with the parent's.
  at::Tensor sum = at::full({1}, 1.0f);
  sub->all_reduce(sum, dist::ReduceOp::Sum);
  CHECK(sum.item<float>() == static_cast<float>(members));
  CHECK_THROWS_WITH(comm->split(-1, 0), Contains("color must be >= 0"));
}

TEST_CASE("communicator: bad arguments fail with a message before any message moves", "[communicator]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  at::Tensor out = at::empty({n * 4});
  CHECK_THROWS_WITH(comm->all_gather(at::zeros({4}, at::kHalf), out), Contains("input is Half but output is Float"));
  CHECK_THROWS_WITH(comm->all_gather(at::zeros({5}), out), Contains("all_gather: output has"));
  CHECK_THROWS_WITH(comm->all_gather(at::zeros({4, 2}).t(), out), Contains("contiguous CPU tensor"));
  at::Tensor small = at::empty({3});
  CHECK_THROWS_WITH(comm->reduce_scatter(at::zeros({n * 4}), small, dist::ReduceOp::Sum),
                    Contains("reduce_scatter: input has"));
  at::Tensor ints = at::empty({4}, at::kInt);
  CHECK_THROWS_WITH(comm->reduce_scatter(at::zeros({n * 4}, at::kInt), ints, dist::ReduceOp::Avg),
                    Contains("Avg needs a floating-point tensor"));
  at::Tensor t = at::zeros({2});
  CHECK_THROWS_WITH(comm->broadcast(t, n), Contains("root"));
  comm->barrier();
}

}  // namespace ditrl
