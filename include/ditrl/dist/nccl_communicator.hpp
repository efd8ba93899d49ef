#pragma once

// NCCL backend of dist::Communicator for CUDA tensors; defined only in CUDA
// builds (-DDITRL_CUDA=ON, src/dist/cuda/nccl_communicator.cpp).
//
// Rank 0 of the MPI communicator creates the ncclUniqueId and broadcasts it
// over MPI; each (sub)communicator is one NCCL communicator. Collectives run
// on a dedicated CUDA stream: it waits for the compute stream's work so far
// (an event), and the compute stream waits for the collective (another event:
// at once for the synchronous forms, at Pending::wait() for *_async), so calls
// return without blocking the host and later kernels see the result. The
// compute stream is LibTorch's current CUDA stream.
//
// Reductions come in two modes: deterministic (the MPI backend's fixed-order
// sum, bitwise equal to it: an all-to-all of chunks then an in-order add on
// the device) and fast (ncclReduceScatter / ncclAllReduce, whose grouping of
// additions is NCCL's choice).
//
// A watchdog thread polls every pending collective and NCCL's asynchronous
// error state; a collective not finished after collective_timeout_s, or an
// NCCL error, aborts the communicator (ncclCommAbort) so no rank hangs on a
// dead peer, and the next call on this communicator throws the reason.

#include <ditrl/dist/communicator.hpp>

#include <memory>

namespace ditrl::dist {

struct NcclOptions {
  int device = 0;                     // CUDA device of this rank
  double startup_timeout_s = 300;     // communicator creation ([parallel] startup_timeout_s)
  double collective_timeout_s = 100;  // each collective ([parallel] collective_timeout_s)
  bool deterministic = true;          // fixed-order reductions ([run] deterministic)
};

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const NcclOptions& options);

}  // namespace ditrl::dist
