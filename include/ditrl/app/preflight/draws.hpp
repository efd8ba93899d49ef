#pragma once

// Seeded inputs for the preflight's collectives: every rank can draw any
// rank's input again, so each checks what it received on its own.

#include <ditrl/app/preflight/report.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::app::preflight {

// The fp32 normals rank `from` contributes to rank `to` in collective `salt`.
at::Tensor chunk(int from, int to, int salt, int64_t elements);
// Rank `rank`'s whole input: its chunks for every rank, in rank order.
at::Tensor rank_input(int rank, int ranks, int salt, int64_t elements);
// DITRL_TEST_PREFLIGHT_FAULT=R (test-only): rank R's result gets one flipped bit.
void inject_fault(at::Tensor& received, int rank);
// Bitwise (`exact`) or within the fast-sum bound.
Local compare(const at::Tensor& got, const at::Tensor& want, bool exact);

}  // namespace ditrl::app::preflight
