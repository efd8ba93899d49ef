#pragma once

// Preemption signals: SIGTERM and SIGUSR1 ask `ditrl train` to checkpoint at
// its next safe point and exit 0 with OUT/status = preempted (what each
// signal does under each launcher: docs/gpus-and-clusters.md, preemption).
//
// The handlers only record the signal. The executable installs them before
// anything else of the process runs (src/main.cpp: its .preinit_array entry,
// which the dynamic linker calls before any shared library's static
// initializers, LibTorch's included), so a signal during start-up is recorded
// instead of ending the rank; `train` acts on it once its ranks can agree.

namespace ditrl::app {

// Records SIGTERM and SIGUSR1 from now on and unblocks both (a deterministic
// re-exec blocks them across the exec, app/determinism.hpp).
void install_stop_handlers();

// The last stop signal received, or 0.
int stop_signal();

// For commands that do not checkpoint: both signals get their default
// actions back, and one already recorded is raised again, so the process
// ends as it would have without the early handlers.
void restore_default_stop_actions();

// Before an exec with SIGTERM and SIGUSR1 blocked: a signal already recorded
// is raised again, so it stays pending across the exec and reaches the new
// image's handlers once they unblock it.
void keep_stop_signal_pending();

}  // namespace ditrl::app
