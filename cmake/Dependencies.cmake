# Every dependency comes through CMake's own find modules or the package's
# config file, except LibTorch (below); scripts/deps.sh installs the Debian
# packages and the pinned PyPI set that provide them.

# LibTorch 2.x is the C++ library inside the PyPI torch wheel: the one in
# the project venv (scripts/deps.sh), or the torch of DITRL_PYTHON (the GPU
# machines' own python3). Its CMake config is not used: it searches the
# system first (Debian's LibTorch 1.13 would win) and drags the CUDA toolkit
# into CPU builds. The CPU build links libtorch_cpu + libc10 only; the CUDA
# build adds libtorch_cuda + libc10_cuda and takes cudart and NCCL from the
# nvidia wheels torch itself loads, so the process holds one copy of each.
if(NOT DITRL_PYTHON)
  if(DEFINED ENV{DITRL_VENV})
    set(DITRL_PYTHON "$ENV{DITRL_VENV}/bin/python")
  else()
    set(DITRL_PYTHON "$ENV{HOME}/.cache/ditrl/venv/bin/python")
  endif()
endif()
set(DITRL_PYTHON "${DITRL_PYTHON}" CACHE FILEPATH "python whose torch package provides LibTorch")
execute_process(
  COMMAND "${DITRL_PYTHON}" -c
          "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(int(torch.backends.cuda.is_built()))"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc ERROR_VARIABLE _torch_err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "ditrl needs LibTorch 2.x from a PyPI torch install, but `${DITRL_PYTHON} -c 'import torch'` "
                      "failed: ${_torch_err}Run scripts/deps.sh (it makes the venv) or pass -DDITRL_PYTHON=<python with torch>.")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 DITRL_TORCH_ROOT)
list(GET _torch_info 1 DITRL_TORCH_VERSION)
list(GET _torch_info 2 _torch_abi)
list(GET _torch_info 3 _torch_cuda)
if(DITRL_TORCH_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "ditrl needs LibTorch >= 2.0; ${DITRL_PYTHON} has torch ${DITRL_TORCH_VERSION}")
endif()
if(NOT _torch_abi)
  message(FATAL_ERROR "torch ${DITRL_TORCH_VERSION} at ${DITRL_TORCH_ROOT} uses the pre-C++11 ABI; Debian's spdlog, "
                      "Boost and toml++ use the C++11 ABI (install a torch wheel built with it, e.g. from PyPI >= 2.7)")
endif()

# torch/include carries its own fmt (12.x); our code and spdlog are built
# against Debian's fmt 9, so that one must come first on the include path.
# (Debian's libfmt-dev, or the GPU kit's copy of it through CMAKE_PREFIX_PATH.)
find_path(DITRL_FMT_INCLUDE_DIR fmt/format.h)
if(NOT DITRL_FMT_INCLUDE_DIR)
  message(FATAL_ERROR "fmt/format.h (Debian's libfmt-dev, which spdlog is built against) not found")
endif()
set(_fmt_shim "${CMAKE_BINARY_DIR}/debian-fmt")
file(MAKE_DIRECTORY "${_fmt_shim}")
file(CREATE_LINK "${DITRL_FMT_INCLUDE_DIR}/fmt" "${_fmt_shim}/fmt" SYMBOLIC)

add_library(ditrl::torch INTERFACE IMPORTED)
set_target_properties(ditrl::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${_fmt_shim};${DITRL_TORCH_ROOT}/include;${DITRL_TORCH_ROOT}/include/torch/csrc/api/include"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1"
  # libgomp is torch's own copy: our OpenMP loops (at::parallel_for is a
  # header template) then share LibTorch's thread pool and thread count.
  INTERFACE_LINK_LIBRARIES
    "${DITRL_TORCH_ROOT}/lib/libtorch_cpu.so;${DITRL_TORCH_ROOT}/lib/libc10.so;${DITRL_TORCH_ROOT}/lib/libgomp.so.1"
  INTERFACE_COMPILE_OPTIONS "-fopenmp")
message(STATUS "ditrl: LibTorch ${DITRL_TORCH_VERSION} from ${DITRL_TORCH_ROOT}")

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

# Boost.JSON by its header and library rather than Boost's CMake configs:
# Debian's boost_json config also demands boost_container's (a library
# Boost.JSON 1.81 never loads), which the GPU kit does not carry, and CMake >= 3.30
# deprecates FindBoost.
find_path(DITRL_BOOST_INCLUDE_DIR boost/json.hpp)
find_library(DITRL_BOOST_JSON_LIBRARY NAMES boost_json)
if(NOT DITRL_BOOST_INCLUDE_DIR OR NOT DITRL_BOOST_JSON_LIBRARY)
  message(FATAL_ERROR "Boost.JSON >= 1.81 not found (header boost/json.hpp: ${DITRL_BOOST_INCLUDE_DIR}; "
                      "library boost_json: ${DITRL_BOOST_JSON_LIBRARY}); on Debian: apt-get install libboost-json1.81-dev")
endif()
file(STRINGS "${DITRL_BOOST_INCLUDE_DIR}/boost/version.hpp" _boost_version REGEX "^#define BOOST_VERSION [0-9]+")
string(REGEX REPLACE "^#define BOOST_VERSION " "" _boost_version "${_boost_version}")
if(_boost_version LESS 108100)
  message(FATAL_ERROR "Boost.JSON >= 1.81 needed; ${DITRL_BOOST_INCLUDE_DIR}/boost/version.hpp says ${_boost_version}")
endif()
add_library(Boost::json INTERFACE IMPORTED)
set_target_properties(Boost::json PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${DITRL_BOOST_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES "${DITRL_BOOST_JSON_LIBRARY}")
# SHA-256 of checkpoints and prompt datasets (io/sha256.cpp): OpenSSL's libcrypto.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# Sample images (io/png.cpp) and animated sample videos (io/webp.cpp): libpng and libwebp's mux library.
find_package(PNG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(WEBP REQUIRED IMPORTED_TARGET libwebp libwebpmux libwebpdemux)
# Reward servers over HTTP/1.1 (rollout/http_reward.cpp): libcurl.
find_package(CURL REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
if(DITRL_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()

if(DITRL_CUDA)
  if(NOT _torch_cuda)
    message(FATAL_ERROR "DITRL_CUDA=ON needs a CUDA build of torch; ${DITRL_TORCH_ROOT} is CPU-only")
  endif()
  # cudart and NCCL as torch loads them: the nvidia-* wheels beside it.
  get_filename_component(_nvidia "${DITRL_TORCH_ROOT}/../nvidia" ABSOLUTE)
  file(GLOB _cuda_dirs LIST_DIRECTORIES true "${_nvidia}/cu*" "${_nvidia}/cuda_runtime")
  foreach(_dir ${_cuda_dirs})
    list(APPEND _cuda_includes "${_dir}/include")
    list(APPEND _cuda_libs "${_dir}/lib")
  endforeach()
  find_path(DITRL_CUDA_INCLUDE_DIR cuda_runtime_api.h PATHS ${_cuda_includes} NO_DEFAULT_PATH)
  find_library(DITRL_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 cudart PATHS ${_cuda_libs} NO_DEFAULT_PATH)
  find_path(DITRL_NCCL_INCLUDE_DIR nccl.h PATHS "${_nvidia}/nccl/include" NO_DEFAULT_PATH)
  find_library(DITRL_NCCL_LIBRARY NAMES libnccl.so.2 nccl PATHS "${_nvidia}/nccl/lib" NO_DEFAULT_PATH)
  foreach(_found DITRL_CUDA_INCLUDE_DIR DITRL_CUDART_LIBRARY DITRL_NCCL_INCLUDE_DIR DITRL_NCCL_LIBRARY)
    if(NOT ${_found})
      message(FATAL_ERROR "DITRL_CUDA=ON: ${_found} not found under ${_nvidia} (the nvidia-* wheels torch "
                          "${DITRL_TORCH_VERSION} loads: nvidia-cuda-runtime, nvidia-nccl)")
    endif()
  endforeach()
  # cuda_runtime.h includes crt/host_config.h, which the wheels leave to nvcc's
  # package: a CUDA toolkit's headers fill that gap (and any other), after the wheels'.
  find_program(_nvcc nvcc HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
  if(_nvcc)
    get_filename_component(_nvcc_include "${_nvcc}/../../include" ABSOLUTE)
  endif()
  # The toolkit's own folder first: a system folder (/usr/local/include) would be
  # searched ahead of the C++ library's once named with -isystem.
  find_path(DITRL_CUDA_TOOLKIT_INCLUDE_DIR crt/host_config.h
            PATHS ${_cuda_includes} ${_nvcc_include} "$ENV{CUDA_HOME}/include" "$ENV{CUDA_PATH}/include" /usr/local/cuda/include
            NO_DEFAULT_PATH)
  find_path(DITRL_CUDA_TOOLKIT_INCLUDE_DIR crt/host_config.h)
  if(NOT DITRL_CUDA_TOOLKIT_INCLUDE_DIR)
    message(FATAL_ERROR "DITRL_CUDA=ON: crt/host_config.h (which cuda_runtime.h includes) is neither under ${_nvidia} "
                        "nor in a CUDA toolkit (nvcc on PATH, CUDA_HOME, /usr/local/cuda); install the CUDA toolkit torch ${DITRL_TORCH_VERSION} was built with "
                        "or the nvidia-cuda-nvcc wheel")
  endif()
  add_library(ditrl::torch_cuda INTERFACE IMPORTED)
  set_target_properties(ditrl::torch_cuda PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${DITRL_CUDA_INCLUDE_DIR};${DITRL_NCCL_INCLUDE_DIR};${DITRL_CUDA_TOOLKIT_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "DITRL_CUDA=1"
    # Nothing of ours calls into libtorch_cuda.so by name (its CUDA kernels
    # and hooks register themselves when it loads), so a linker that defaults
    # to --as-needed (Debian's and Ubuntu's gcc) drops it: every CUDA tensor
    # then fails with "Could not run 'aten::empty.memory_format' with
    # arguments from the 'CUDA' backend". Kept as LibTorch's own
    # Caffe2Targets.cmake keeps it; dist::cuda_kernels_loaded() checks.
    INTERFACE_LINK_LIBRARIES
      "-Wl,--push-state,--no-as-needed,${DITRL_TORCH_ROOT}/lib/libtorch_cuda.so,--pop-state;${DITRL_TORCH_ROOT}/lib/libc10_cuda.so;${DITRL_CUDART_LIBRARY};${DITRL_NCCL_LIBRARY}")
  message(STATUS "ditrl: CUDA runtime ${DITRL_CUDART_LIBRARY}, NCCL ${DITRL_NCCL_LIBRARY}")
endif()

set(DITRL_WARNINGS -Wall -Wextra)
# GCC 13 flags std::vector<bool>::reserve inlined into torch::autograd::Function::apply
# (-Warray-bounds, "forming offset 8 is out of the bounds [0, 8]", and, once that is off,
# -Wstringop-overflow, "writing between 9 and 9223372036854775807 bytes into a region of
# size 8"): false positives in libstdc++'s own code, seen on the H200 machine's Ubuntu
# g++ 13.3; GCC 12 is silent.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
  list(APPEND DITRL_WARNINGS -Wno-array-bounds -Wno-stringop-overflow)
endif()
if(DITRL_WERROR)
  list(APPEND DITRL_WARNINGS -Werror)
endif()
