#pragma once

// The host malloc. The ditrl executables link gperftools' tcmalloc (CMake
// option DITRL_TCMALLOC, on by default): a step of a small model makes
// thousands of short-lived allocations, and glibc's malloc and free had
// 20-26% of the quickstart's perf samples (malloc_consolidate, memalign).
// With tcmalloc the tiny peer steps took 0.71-0.95x the time
// (benchmarks/results/peer_forward.md).
//
// Under glibc's malloc (a build without tcmalloc) freed memory goes back to
// the kernel: glibc trims the heap's top once more than the trim threshold
// (128 KiB at start) is free. A training step frees its activations at the
// end of each backward and allocates them again in the next forward, so on
// the CPU every step faulted the same pages in again (the flow_grpo
// benchmark deck: 136-190k page faults per 15 rollouts, 48k with the
// thresholds set here; benchmarks/results/flow_grpo_loop.md). A user's
// GLIBC_TUNABLES malloc settings or MALLOC_*_ variables win over these.

#include <string>

namespace ditrl::app {

// Whether tcmalloc serves this process's malloc (linked into the executable).
bool tcmalloc_in_use();

// "tcmalloc (gperftools X.Y)" or "glibc X.Y".
std::string host_malloc_name();

// Under glibc's malloc, sets the thresholds unless the environment sets
// malloc's own; returns whether both were set (never under tcmalloc).
bool keep_freed_host_memory();

}  // namespace ditrl::app
