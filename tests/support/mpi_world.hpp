#pragma once

// This process's place in MPI_COMM_WORLD, for multi-rank test cases.

#include <mpi.h>

namespace ditrl::test {

inline int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace ditrl::test
