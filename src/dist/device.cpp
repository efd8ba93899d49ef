#include <ditrl/cuda_build.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#ifdef DITRL_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>

namespace ditrl::dist {

namespace {

std::string visible_devices_variable() {
  const char* value = std::getenv("CUDA_VISIBLE_DEVICES");
  return value ? fmt::format("CUDA_VISIBLE_DEVICES={}", value) : std::string("CUDA_VISIBLE_DEVICES unset");
}

int gpu_of(const WorldInfo& world, int gpus) {
  if (gpus == 1) return 0;
  if (world.local_rank < gpus) return world.local_rank;
  fail(
      "run.device: node-local rank {} of {} on {} has no GPU of its own: {} GPU(s) visible ({}); start at most one "
      "rank per GPU, or give each task one GPU (srun --gpus-per-task=1)",
      world.local_rank, world.local_size, world.host, gpus, visible_devices_variable());
}

void bind_gpu(int index) {
#ifdef DITRL_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  (void)index;
#endif
}

}  // namespace

int visible_gpus() {
#ifdef DITRL_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

int nvidia_gpus_present() {
  if (const char* fake = std::getenv("DITRL_FAKE_NVIDIA_GPUS")) return std::atoi(fake);
  namespace fs = std::filesystem;
  std::error_code ec;
  int driver_entries = 0;
  for (fs::directory_iterator it("/proc/driver/nvidia/gpus", ec), end; !ec && it != end; it.increment(ec))
    ++driver_entries;
  if (driver_entries > 0) return driver_entries;
  // Containers often carry the device files without the driver's /proc tree.
  static const std::regex device_file("nvidia[0-9]+");
  int device_files = 0;
  for (fs::directory_iterator it("/dev", ec), end; !ec && it != end; it.increment(ec))
    if (std::regex_match(it->path().filename().string(), device_file)) ++device_files;
  return device_files;
}

namespace {

bool gpus_left_unused(c10::Device device, const std::string& request) {
  return !kCudaBuild && device.is_cpu() && request == "auto" && nvidia_gpus_present() > 0;
}

std::string gpu_name(c10::Device device) {
#ifdef DITRL_CUDA
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device.index()) == cudaSuccess) return properties.name;
#else
  (void)device;
#endif
  return "unknown GPU";
}

}  // namespace

std::string device_identity(c10::Device device, const std::string& request) {
  if (device.is_cuda()) return fmt::format("{} ({})", device.str(), gpu_name(device));
  if (gpus_left_unused(device, request))
    return fmt::format("cpu (CPU-only build; {} NVIDIA GPU(s) on this machine unused)", nvidia_gpus_present());
  return device.str();
}

std::string unused_gpu_warning(c10::Device device, const std::string& request) {
  if (!gpus_left_unused(device, request)) return "";
  const std::string rule(78, '*');
  return fmt::format(
      "\n{0}\n* WARNING: this machine has {1} NVIDIA GPU(s), but this ditrl is a CPU-only build:\n"
      "* run.device = \"auto\" trains on the CPU, far slower. Build the CUDA variant\n"
      "* (cmake -DDITRL_CUDA=ON; scripts/quickstart.sh does it when it sees a GPU),\n"
      "* or set run.device = \"cpu\" to mean it (docs/gpus-and-clusters.md).\n{0}",
      rule, nvidia_gpus_present());
}

bool cuda_kernels_loaded() {
  const auto empty = c10::Dispatcher::singleton().findSchema({"aten::empty", "memory_format"});
  return empty && empty->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

c10::Device choose_device(const std::string& request, const WorldInfo& world) {
  if (request == "cpu") return c10::kCPU;
  if (request != "cuda" && request != "auto")
    fail("run.device = \"{}\": expected \"auto\", \"cpu\" or \"cuda\"", request);
  if (!kCudaBuild) {
    if (request == "auto") return c10::kCPU;
    fail("run.device = \"cuda\" but this build of ditrl is CPU-only (configure with -DDITRL_CUDA=ON)");
  }
  const int gpus = visible_gpus();
  if (gpus == 0) {
    if (request == "auto") return c10::kCPU;
    fail("run.device = \"cuda\" but no GPU is visible to rank {} on {} ({})", world.rank, world.host,
         visible_devices_variable());
  }
  if (!cuda_kernels_loaded())
    fail(
        "run.device: rank {} on {} sees {} GPU(s), but this CUDA build of ditrl runs without LibTorch's CUDA kernels "
        "(libtorch_cuda.so is not loaded: linked --as-needed?)",
        world.rank, world.host, gpus);
  const int index = gpu_of(world, gpus);
  bind_gpu(index);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

double peak_device_bytes(c10::Device device) {
  if (!device.is_cuda()) return std::nan("");
#ifdef DITRL_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  return static_cast<double>(
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
#else
  return std::nan("");
#endif
}

int64_t free_device_bytes(c10::Device device) {
  if (!device.is_cuda()) return -1;
#ifdef DITRL_CUDA
  c10::cuda::CUDAGuard guard(device.index());
  size_t free = 0, total = 0;
  if (const cudaError_t status = cudaMemGetInfo(&free, &total); status != cudaSuccess)
    fail("cudaMemGetInfo on {}: {}", device.str(), cudaGetErrorString(status));
  return static_cast<int64_t>(free);
#else
  return -1;
#endif
}

at::Tensor host_to_device(const at::Tensor& host, c10::Device device) {
  if (!device.is_cuda() || !host.device().is_cpu()) return host.to(device);
  // The host allocator keeps the pinned block until the copy has run.
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

void finish_host_copies(c10::Device device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
  at::getHostAllocator(device.type())->empty_cache();
}

ForbidHostSync::ForbidHostSync(bool on, c10::Device device) {
#ifdef DITRL_CUDA
  if (!on || !device.is_cuda()) return;
  active_ = true;
  previous_ = static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
#else
  (void)on;
  (void)device;
#endif
}

ForbidHostSync::~ForbidHostSync() {
#ifdef DITRL_CUDA
  if (active_) c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_));
#endif
}

}  // namespace ditrl::dist
