#pragma once

// The data communicator of the multi-rank CUDA suites (tests/mpi/cuda/):
// NCCL with one GPU per rank (the node-local rank's), or, under
// DITRL_TEST_DATA_BACKEND=mpi, MPI through pinned host buffers with every
// rank on the first visible GPU ([parallel] data_backend = "mpi"), which is
// how the suites run at 2 and 4 ranks on one GPU (tests/CMakeLists.txt
// registers those runs as mpi.<suite>.mpi_data.np<N>).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>

#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace ditrl::test {

// True under DITRL_TEST_DATA_BACKEND=mpi.
inline bool mpi_data_backend() {
  const char* backend = std::getenv("DITRL_TEST_DATA_BACKEND");
  return backend && std::string(backend) == "mpi";
}

inline int node_local_rank() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  return local_rank;
}

// This rank's GPU, made the current device.
inline c10::Device test_gpu() {
  const int index = mpi_data_backend() ? 0 : node_local_rank();
  cudaSetDevice(index);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// The suite's data communicator over MPI_COMM_WORLD for tensors on test_gpu().
inline std::unique_ptr<dist::Communicator> data_communicator(double collective_timeout_s = 30,
                                                             bool deterministic = true) {
  const c10::Device gpu = test_gpu();
  if (mpi_data_backend()) return dist::make_host_staged_communicator(dist::make_mpi_communicator(MPI_COMM_WORLD));
  return dist::make_nccl_communicator(MPI_COMM_WORLD, {gpu.index(), 60, collective_timeout_s, deterministic});
}

// "NCCL" or "MPI (host-staged)", for messages.
inline const char* data_backend_name() {
  return mpi_data_backend() ? "MPI (host-staged)" : "NCCL";
}

}  // namespace ditrl::test
