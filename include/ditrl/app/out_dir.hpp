#pragma once

// What a run folder (run.out_dir) must be for `ditrl train` to write it,
// checked by `ditrl check` and by `train` itself before it starts MPI, so
// both refuse the same folders with the same words: no NUL character in the
// path; a folder (or a path under one) that takes new entries, tried by
// making and removing one there (a permission bit says nothing under /proc
// or on a read-only mount); and, where the folder holds them already, the
// run's entries of the kinds it writes (logs/ and checkpoints/ folders;
// status, metrics.h5, checkpoints/latest and .lock files).

#include <ditrl/config/deck.hpp>

namespace ditrl::app {

void check_out_dir(const config::Config& config);

}  // namespace ditrl::app
