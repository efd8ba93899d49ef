#pragma once

// The device a rank computes on: `[run] device` resolved against this build
// and the GPUs the process sees, and the GPU bound before any other CUDA call.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace ditrl::dist {

struct WorldInfo;

// GPUs this process may use (CUDA_VISIBLE_DEVICES applies); 0 in a CPU build.
int visible_gpus();

// NVIDIA GPUs this machine has, whatever this build can use: the driver's
// /proc/driver/nvidia/gpus/* entries, else the /dev/nvidia<N> device files.
// Needs no CUDA. DITRL_FAKE_NVIDIA_GPUS=N (test-only: a CPU test of the
// unused-GPU warning) replaces the count.
int nvidia_gpus_present();

// Where a rank computes, as the run's identity records it (the metrics
// file's `device` attribute): "cpu", "cuda:0 (NVIDIA H200)", or "cpu
// (CPU-only build; N NVIDIA GPU(s) on this machine unused)" when a CPU-only
// build resolved run.device = "auto" on a machine with GPUs.
std::string device_identity(c10::Device device, const std::string& request);

// The loud start-up block for that last case (empty otherwise): such a run
// trains on the CPU, one or two orders of magnitude slower, without error.
std::string unused_gpu_warning(c10::Device device, const std::string& request);

// Whether LibTorch's CUDA kernels are in this process (libtorch_cuda.so
// loaded). Without them the GPUs are still counted (libc10_cuda), but no
// tensor can live on one. Needs no GPU to answer.
bool cuda_kernels_loaded();

// "cpu" -> CPU; "cuda" -> the rank's GPU, an error when this is a CPU build or
// no GPU is visible; "auto" -> the GPU when there is one, else the CPU.
// The rank's GPU is its node-local rank among the visible GPUs, or the only
// visible one (Slurm's --gpus-per-task gives each task one). Binds it as the
// current device. A CUDA build without LibTorch's CUDA kernels is an error.
c10::Device choose_device(const std::string& request, const WorldInfo& world);

// Peak bytes of live tensors on `device` since the process started, from
// the CUDA caching allocator (what `ditrl plan`'s state and activation terms
// predict on a GPU; the allocator's reserve on top is fragmentation); NaN
// on the CPU, whose peak is the resident set (app/progress.hpp).
double peak_device_bytes(c10::Device device);

// Free bytes on a GPU `device` (cudaMemGetInfo: what other processes and
// this one's caching allocator hold is gone); -1 on the CPU.
int64_t free_device_bytes(c10::Device device);

// `host` (a CPU tensor) on `device`. To a GPU it travels through pinned
// memory without the host waiting: a copy from pageable memory waits for
// every kernel already queued on the stream, which would drain the GPU's
// queue at each micro-batch and each denoising step.
at::Tensor host_to_device(const at::Tensor& host, c10::Device device);

// Waits until the copies queued to a GPU `device` have run, then returns the
// pinned blocks LibTorch's caching host allocator keeps to the system (the
// staging buffers of loading, not needed again: the allocator never frees
// them otherwise). Nothing on the CPU.
void finish_host_copies(c10::Device device);

// While one lives with `on` and a GPU `device`, a call that makes the host
// wait for the GPU (an .item(), a copy to or from pageable memory, a stream
// synchronize) throws LibTorch's error naming it; otherwise it does nothing.
// `debug.forbid_host_sync` puts each training micro-batch's forward and
// backward under one.
class ForbidHostSync {
 public:
  ForbidHostSync(bool on, c10::Device device);
  ~ForbidHostSync();
  ForbidHostSync(const ForbidHostSync&) = delete;
  ForbidHostSync& operator=(const ForbidHostSync&) = delete;

 private:
  bool active_ = false;
  int previous_ = 0;  // the sync debug mode it replaced
};

}  // namespace ditrl::dist
