#pragma once

// glibc's malloc hands freed memory back to the kernel: it trims the heap's
// top once more than the trim threshold (128 KiB at start) is free. A
// training step frees its activations at the end of each backward and
// allocates them again in the next forward, so on the CPU every step faulted
// the same pages in again (the flow_grpo benchmark deck: 136-190k page
// faults per 15 rollouts, 48k with the thresholds set here; the measured
// time and memory are in benchmarks/results/flow_grpo_loop.md). A user's
// GLIBC_TUNABLES malloc settings or MALLOC_*_ variables win over these.

namespace ditrl::app {

// Sets the thresholds unless the environment sets malloc's own; returns
// whether both were set.
bool keep_freed_host_memory();

}  // namespace ditrl::app
