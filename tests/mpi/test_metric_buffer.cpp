// ditrl-mpi-ranks: 1 2 4
#include <ditrl/dist/communicator.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rl/metric_buffer.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

namespace ditrl {
namespace {

using rl::MetricBuffer;
using rl::MetricReduce;

rl::MetricSchema schema() {
  return {{"loss", MetricReduce::Mean},
          {"clipfrac", MetricReduce::Mean},
          {"max_diff", MetricReduce::Max},
          {"grad_norm", MetricReduce::Replicated}};
}

}  // namespace

TEST_CASE("metric buffer: MEAN is item-weighted over all ranks / MAX is the global max", "[metric_buffer]") {
  auto comm = dist::make_mpi_communicator();
  const int n = comm->size();
  const int r = comm->rank();
  MetricBuffer m(schema(), c10::kCPU);
  // Rank r sees r+1 items of value r (uneven counts: a mean of per-rank means would differ).
  m.emit_mean("loss", at::scalar_tensor(static_cast<double>(r * (r + 1)), at::kFloat), r + 1);
  m.emit_max("max_diff", 0.5 * r - 1.0);
  m.emit_replicated("grad_norm", 3.25);
  const auto out = m.reduce(*comm);

  double total = 0, items = 0;
  for (int k = 0; k < n; ++k) total += k * (k + 1), items += k + 1;
  CHECK(out.at("loss") == total / items);
  CHECK(out.at("max_diff") == 0.5 * (n - 1) - 1.0);
  CHECK(out.at("grad_norm") == 3.25);
  CHECK(out.count("clipfrac") == 0);  // no rank counted an item: not a datapoint
}

TEST_CASE("metric buffer: a metric only some ranks saw is still reduced everywhere", "[metric_buffer]") {
  auto comm = dist::make_mpi_communicator();
  MetricBuffer m(schema(), c10::kCPU);
  if (comm->rank() == comm->size() - 1) {
    m.emit_mean("clipfrac", 0.75, 3);
    m.emit_max("max_diff", 7.0);
  }
  const auto out = m.reduce(*comm);
  CHECK(out.at("clipfrac") == 0.25);
  CHECK(out.at("max_diff") == 7.0);
  CHECK(out.count("loss") == 0);
}

TEST_CASE("metric buffer: ranks with different schemas fail with a clear error", "[metric_buffer]") {
  auto comm = dist::make_mpi_communicator();
  if (comm->size() == 1) return;  // needs a peer to disagree with
  rl::MetricSchema mine = schema();
  if (comm->rank() == 1) mine["extra"] = MetricReduce::Mean;
  MetricBuffer m(mine, c10::kCPU);
  CHECK_THROWS_WITH(m.reduce(*comm), Catch::Matchers::Contains("metric schema that differs"));
}

}  // namespace ditrl
