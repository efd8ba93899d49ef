#include <ditrl/cuda_build.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/runtime.hpp>

#include <catch2/catch.hpp>

#include "process.hpp"

#include <cstdlib>

using Catch::Matchers::Contains;

TEST_CASE("runtime: a rank that throws ends the whole job non-zero within 30 s", "[runtime][mpi]") {
  const std::string command = std::string("timeout 60 ") + DITRL_MPIEXEC + " -np 2 " + DITRL_PROBE_fail_probe;
  const auto result = ditrl::test::run_process(command);
  INFO(result.output);
  CHECK(result.exit_code != 0);
  CHECK(result.exit_code != 124);  // 124 = timeout(1) had to kill a hang
  CHECK(result.seconds < 30.0);
  CHECK_THAT(result.output, Contains("error on rank 1: probe failure raised on purpose"));
}

// A CUDA build must load libtorch_cuda.so although none of its symbols is
// named (cmake/Dependencies.cmake links it --no-as-needed); a CPU build
// links LibTorch's CPU library alone. Neither needs a GPU to tell.
TEST_CASE("runtime: LibTorch's CUDA kernels are loaded exactly in a CUDA build", "[runtime][device]") {
  CHECK(ditrl::dist::cuda_kernels_loaded() == ditrl::kCudaBuild);
}

TEST_CASE("runtime: the launcher's local rank is cross-checked", "[runtime]") {
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");  // they come first; this case is srun's
  unsetenv("MPI_LOCALRANKID");
  setenv("SLURM_LOCALID", "3", 1);
  auto check = ditrl::dist::check_local_rank(1);
  CHECK(check.from_launcher == 3);
  CHECK(check.launcher_variable == "SLURM_LOCALID");
  CHECK_THAT(check.warning, Contains("differs from SLURM_LOCALID=3"));
  setenv("SLURM_LOCALID", "1", 1);
  CHECK(ditrl::dist::check_local_rank(1).warning.empty());
  unsetenv("SLURM_LOCALID");
}

TEST_CASE("runtime: under mpirun in a Slurm allocation the stale SLURM_LOCALID is not used", "[runtime]") {
  // mpirun's ranks inherit SLURM_LOCALID=0 from the srun step that started
  // their node's orted; OMPI_COMM_WORLD_LOCAL_RANK is their own.
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const std::string before = saved ? saved : "";
  setenv("SLURM_LOCALID", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  auto check = ditrl::dist::check_local_rank(1);
  CHECK(check.launcher_variable == "OMPI_COMM_WORLD_LOCAL_RANK");
  CHECK(check.from_launcher == 1);
  CHECK(check.warning.empty());
  unsetenv("SLURM_LOCALID");
  if (saved)
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", before.c_str(), 1);
  else
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST_CASE("runtime: --version lists every dependency", "[runtime][cli]") {
  const auto result = ditrl::test::run_process(std::string(DITRL_BINARY) + " --version");
  CHECK(result.exit_code == 0);
  for (const char* name :
       {"ditrl ", "LibTorch", "BLAS", "oneDNN", "MPI", "HDF5", "Boost", "toml++", "CLI11", "OpenSSL", "spdlog", "CUDA"})
    CHECK_THAT(result.output, Contains(name));
  CHECK_THAT(result.output, Contains("parallel"));
  // The commit is read at build time, not when CMake configured the build directory.
  const auto head = ditrl::test::run_process("git -C " + std::string(DITRL_SOURCE_DIR) + " rev-parse --short HEAD");
  if (head.exit_code == 0) {
    const std::string commit = head.output.substr(0, head.output.find('\n'));
    INFO("git HEAD is " << commit << ": a binary built at another commit needs a rebuild (ninja) before ctest");
    CHECK_THAT(result.output, Contains("(commit " + commit + ","));
  }
}
