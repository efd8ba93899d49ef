#include <ditrl/app/commands.hpp>
#include <ditrl/app/host_malloc.hpp>
#include <ditrl/build_info.hpp>
#include <ditrl/io/sha256.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/format.h>
#include <hdf5.h>
#include <mpi.h>
#include <spdlog/version.h>
#include <toml++/toml.h>
#include <torch/version.h>
#include <CLI/Version.hpp>
#include <boost/version.hpp>
#ifdef DITRL_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <sstream>

namespace ditrl::app {

namespace {

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string line(text, static_cast<size_t>(length));
  if (size_t cut = line.find_first_of(",\n"); cut != std::string::npos) line.resize(cut);
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return fmt::format("{} (MPI {}.{})", line, major, minor);
}

std::string hdf5_library() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
#ifdef H5_HAVE_PARALLEL
  const char* flavour = "parallel";
#else
  const char* flavour = "serial";
#endif
  return fmt::format("{}.{}.{} ({})", major, minor, release, flavour);
}

// The first line of ATen's build report containing `key`, from `key` on
// (e.g. the "CPU capability" it dispatches to, the BLAS it was built with).
std::string torch_config_line(const std::string& key) {
  std::istringstream config(at::show_config());
  for (std::string line; std::getline(config, line);)
    if (const size_t at = line.find(key); at != std::string::npos) return line.substr(at);
  return key + " unknown";
}

}  // namespace

std::string version_text() {
  std::string text = fmt::format("ditrl {} (commit {}, {} build, {})\n", build::kVersion, build::git_commit(),
                                 build::kBuildType, build::kCompiler);
  text += fmt::format("  LibTorch   {} ({}, {}, {} intra-op threads)\n", TORCH_VERSION,
#ifdef DITRL_CUDA
                      "CUDA build",
#else
                      "CPU build",
#endif
                      torch_config_line("CPU capability"), at::get_num_threads());
  text += fmt::format("  BLAS       {}\n", torch_config_line("Math Kernel Library"));
  const bool onednn_fp32 = precision::parse_cpu_fp32_gemm("auto", false) == precision::CpuFp32Gemm::Onednn;
  text += fmt::format("  oneDNN     {} (fp32 GEMMs on this CPU, precision.cpu_fp32_gemm = \"auto\": {})\n",
                      torch_config_line("MKL-DNN"), onednn_fp32 ? "oneDNN, BLAS in deterministic runs" : "BLAS");
  text += fmt::format("  MPI        {}\n", mpi_library());
  text += fmt::format("  HDF5       {}\n", hdf5_library());
  text += fmt::format("  Boost      {}.{}.{} (Boost.JSON)\n", BOOST_VERSION / 100000, BOOST_VERSION / 100 % 1000,
                      BOOST_VERSION % 100);
  text += fmt::format("  toml++     {}.{}.{}\n", TOML_LIB_MAJOR, TOML_LIB_MINOR, TOML_LIB_PATCH);
  text += fmt::format("  CLI11      {}\n", CLI11_VERSION);
  text += fmt::format("  OpenSSL    {} (libcrypto: SHA-256)\n", io::sha256_library_version());
  text += fmt::format("  malloc     {}\n", host_malloc_name());
  text += fmt::format("  spdlog     {}.{}.{} (fmt {}.{}.{})\n", SPDLOG_VER_MAJOR, SPDLOG_VER_MINOR, SPDLOG_VER_PATCH,
                      FMT_VERSION / 10000, FMT_VERSION / 100 % 100, FMT_VERSION % 100);
#ifdef DITRL_CUDA
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl);
  text += fmt::format("  CUDA       runtime {}.{}, driver {}\n", runtime / 1000, runtime % 1000 / 10,
                      driver ? fmt::format("{}.{}", driver / 1000, driver % 1000 / 10) : std::string("none"));
  text += fmt::format("  NCCL       {}.{}.{}\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
#else
  text += "  CUDA/NCCL  not built (configure with -DDITRL_CUDA=ON)\n";
#endif
  return text;
}

}  // namespace ditrl::app
