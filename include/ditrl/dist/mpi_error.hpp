#pragma once

// MPI return codes as exceptions: the communicators run with
// MPI_ERRORS_RETURN, so a failed call becomes an Error naming the call and
// MPI's message, which main() turns into MPI_Abort.

namespace ditrl::dist {

void check_mpi(int code, const char* call);

}  // namespace ditrl::dist
