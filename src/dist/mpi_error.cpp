// check_mpi: an MPI error code as an Error naming the call.

#include <ditrl/dist/mpi_error.hpp>
#include <ditrl/error.hpp>

#include <mpi.h>

#include <string>

namespace ditrl::dist {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail("{} failed: {}", call, std::string(text, length));
}

}  // namespace ditrl::dist
