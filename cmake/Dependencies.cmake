# Every dependency comes through CMake's own find modules or the package's
# config file; scripts/deps.sh installs the Debian packages that provide them.

find_package(Torch REQUIRED)
# LibTorch's parallel backend is OpenMP, and at::parallel_for is a header
# template: our own parallel loops run on one thread unless we compile with
# OpenMP too (measured: 2 threads hashed at 1.0x without it, 1.9x with).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(MPI REQUIRED COMPONENTS C)

set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR
    "ditrl needs the parallel (MPI) flavour of HDF5, but CMake found a serial HDF5 "
    "(${HDF5_INCLUDE_DIRS}). Install libhdf5-openmpi-dev (scripts/deps.sh does) "
    "and remove the serial libhdf5-dev from the search path, or point HDF5_ROOT at "
    "the openmpi build.")
endif()
if(NOT TARGET hdf5::hdf5)
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  set_target_properties(hdf5::hdf5 PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${HDF5_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${HDF5_C_LIBRARIES}")
endif()

find_package(Boost 1.81 REQUIRED COMPONENTS json)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
if(DITRL_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()

if(DITRL_CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "DITRL_CUDA=ON but NCCL was not found (nccl.h / libnccl); "
                        "set NCCL_HOME or install NCCL next to the CUDA toolkit.")
  endif()
  add_library(ditrl::nccl INTERFACE IMPORTED)
  set_target_properties(ditrl::nccl PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}")
  # A LibTorch built with CUDA (the GPU build's 2.x) provides its current CUDA
  # stream through libc10_cuda; the Debian CPU LibTorch has the headers only.
  if(C10_CUDA_LIBRARY)
    set_property(TARGET ditrl::nccl APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS DITRL_TORCH_CUDA=1)
    set_property(TARGET ditrl::nccl APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${C10_CUDA_LIBRARY}")
  endif()
  message(STATUS "ditrl: CUDA ${CUDAToolkit_VERSION}, NCCL ${NCCL_LIBRARY}")
endif()

set(DITRL_WARNINGS -Wall -Wextra)
if(DITRL_WERROR)
  list(APPEND DITRL_WARNINGS -Werror)
endif()
