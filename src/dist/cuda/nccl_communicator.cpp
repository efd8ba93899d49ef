// NCCL backend of dist::Communicator (see dist/nccl_communicator.hpp).
//
// Collectives are ordered after LibTorch's current CUDA stream (the compute
// stream) by events.
//
// The NCCL communicator is non-blocking (config.blocking = 0): every NCCL
// call returns at once, possibly with ncclInProgress, so a host thread never
// sits inside NCCL where a dead peer could hold it forever. All NCCL calls
// and the watchdog's checks hold one mutex; ncclCommAbort from the watchdog
// therefore never races a call on the main thread.

#include <ditrl/dist/mpi_error.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/error.hpp>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace ditrl::dist {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) fail("{} failed: {} ({})", call, cudaGetErrorName(code), cudaGetErrorString(code));
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

ncclDataType_t nccl_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return ncclFloat32;
    case c10::ScalarType::BFloat16:
      return ncclBfloat16;
    case c10::ScalarType::Half:
      return ncclFloat16;
    case c10::ScalarType::Double:
      return ncclFloat64;
    case c10::ScalarType::Int:
      return ncclInt32;
    case c10::ScalarType::Long:
      return ncclInt64;
    case c10::ScalarType::Char:
      return ncclInt8;
    case c10::ScalarType::Byte:
      return ncclUint8;
    default:
      fail("Communicator(NCCL): no NCCL reduction for dtype {}", c10::toString(dtype));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

cudaStream_t compute_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm owned, const NcclOptions& options) : mpi_(owned), options_(options) {
    try {
      open();
    } catch (...) {
      close();
      throw;
    }
  }
  ~NcclCommunicator() override { close(); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    check_tensor(input, "all_gather", "input");
    check_tensor(output, "all_gather", "output");
    check_same_dtype(input, output, "all_gather");
    if (output.numel() != input.numel() * size_)
      fail("Communicator(NCCL)::all_gather: output has {} elements, expected {} ranks x {}", output.numel(), size_,
           input.numel());
    // Raw bytes: any dtype gathers bit-exactly.
    enqueue("all_gather", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm, stream);
    });
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    check_tensor(input, "reduce_scatter", "input");
    check_tensor(output, "reduce_scatter", "output");
    check_same_dtype(input, output, "reduce_scatter");
    if (input.numel() != output.numel() * size_)
      fail("Communicator(NCCL)::reduce_scatter: input has {} elements, expected {} ranks x {}", input.numel(), size_,
           output.numel());
    const ncclDataType_t dtype = nccl_dtype(input.scalar_type());
    enqueue("reduce_scatter", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), dtype, nccl_op(op), comm, stream);
    });
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce", "tensor");
    const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type());
    enqueue("all_reduce", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, nccl_op(op), comm, stream);
    });
  }

  void broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast", "tensor");
    if (root < 0 || root >= size_) fail("Communicator(NCCL)::broadcast: root {} outside [0, {})", root, size_);
    enqueue("broadcast", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(), ncclUint8, root, comm, stream);
    });
  }

  // An all-reduce of one integer that the host waits for: every rank has
  // reached it when it returns (or the watchdog's timeout throws).
  void barrier() override {
    enqueue("barrier", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm, stream);
    });
    wait_for_stream();
  }

  // Already asynchronous: the collective is queued on the communication
  // stream and the compute stream waits for it by event.
  Pending all_gather_async(const at::Tensor& input, const at::Tensor& output) override {
    at::Tensor out = output;
    all_gather(input, out);
    return {};
  }
  Pending reduce_scatter_async(const at::Tensor& input, const at::Tensor& output, ReduceOp op) override {
    at::Tensor out = output;
    reduce_scatter(input, out, op);
    return {};
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("Communicator(NCCL)::split: color must be >= 0 (got {})", color);
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(mpi_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<NcclCommunicator>(sub, options_);
  }

 private:
  struct InFlight {
    cudaEvent_t done;
    std::string what;
    Clock::time_point deadline;
  };

  void open() {
    check_mpi(MPI_Comm_rank(mpi_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(mpi_, &size_), "MPI_Comm_size");
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_), "MPI_Bcast(ncclUniqueId)");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)), "cudaMalloc");
    check_cuda(cudaMemset(barrier_word_, 0, sizeof(int)), "cudaMemset");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const Clock::time_point deadline = deadline_after(options_.startup_timeout_s);
    std::unique_lock<std::mutex> lock(mutex_);
    const ncclResult_t started = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    wait_in_progress(lock, started, "ncclCommInitRankConfig", deadline, options_.startup_timeout_s);
    lock.unlock();
    watchdog_ = std::thread([this] { watch(); });
  }

  // Best effort and never throws: flushes a healthy communicator, aborts one
  // that failed or does not finish in time.
  void close() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) {
      bool clean = failure_.empty() && stream_ && wait_stream_quietly(deadline_after(options_.collective_timeout_s));
      if (clean) {
        ncclResult_t state = ncclCommFinalize(comm_);
        const Clock::time_point deadline = deadline_after(options_.collective_timeout_s);
        while (state == ncclInProgress && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ncclCommGetAsyncError(comm_, &state);
        }
        clean = state == ncclSuccess;
      }
      if (clean) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    for (InFlight& p : pending_) cudaEventDestroy(p.done);
    pending_.clear();
    if (barrier_word_) cudaFree(barrier_word_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    barrier_word_ = nullptr, ready_ = nullptr, stream_ = nullptr;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }

  // Orders the collective after the compute stream's queued work, issues it
  // on the communication stream, makes the compute stream wait for it and
  // hands its completion event to the watchdog.
  template <class Call>
  void enqueue(const char* what, Call call) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_failed();
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    const cudaStream_t compute = compute_stream(options_.device);
    check_cuda(cudaEventRecord(ready_, compute), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    const ncclResult_t issued = call(comm_, stream_);
    wait_in_progress(lock, issued, what, deadline_after(options_.collective_timeout_s), options_.collective_timeout_s);
    cudaEvent_t done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(compute, done, 0), "cudaStreamWaitEvent");
    pending_.push_back({done, what, deadline_after(options_.collective_timeout_s)});
    lock.unlock();
    wake_.notify_all();
  }

  // A non-blocking NCCL call may still be in progress when it returns; poll
  // its state (releasing the lock between polls) until it settles or the
  // deadline passes, which aborts the communicator.
  void wait_in_progress(std::unique_lock<std::mutex>& lock, ncclResult_t state, const char* what,
                        Clock::time_point deadline, double timeout_s) {
    while (state == ncclInProgress) {
      if (Clock::now() > deadline) {
        abort_locked(fmt::format("NCCL {} did not complete within {} s on rank {} of {} (a peer is dead or stuck)",
                                 what, timeout_s, rank_, size_));
        throw_if_failed();
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
      throw_if_failed();
      check_nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    }
    check_nccl(state, what);
  }

  void wait_for_stream() {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        throw_if_failed();
        const cudaError_t state = cudaStreamQuery(stream_);
        if (state == cudaSuccess) return;
        if (state != cudaErrorNotReady) check_cuda(state, "cudaStreamQuery");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  bool wait_stream_quietly(Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return true;
      if (state != cudaErrorNotReady) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // Watchdog thread: retires finished collectives, checks NCCL's
  // asynchronous error and the oldest pending collective's deadline.
  void watch() {
    cudaSetDevice(options_.device);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      while (!pending_.empty()) {
        const cudaError_t state = cudaEventQuery(pending_.front().done);
        if (state == cudaErrorNotReady) break;
        cudaEventDestroy(pending_.front().done);
        const std::string what = pending_.front().what;
        pending_.pop_front();
        if (state != cudaSuccess)
          abort_locked(fmt::format("CUDA error after NCCL {} on rank {}: {}", what, rank_, cudaGetErrorString(state)));
      }
      if (comm_ && failure_.empty()) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        if (async != ncclSuccess && async != ncclInProgress)
          abort_locked(fmt::format("NCCL asynchronous error on rank {}: {} ({})", rank_, ncclGetErrorString(async),
                                   ncclGetLastError(comm_)));
        else if (!pending_.empty() && Clock::now() > pending_.front().deadline)
          abort_locked(fmt::format("NCCL {} did not complete within {} s on rank {} of {} (a peer is dead or stuck)",
                                   pending_.front().what, options_.collective_timeout_s, rank_, size_));
      }
      wake_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 100 : 5));
    }
  }

  void abort_locked(const std::string& reason) {
    if (!failure_.empty()) return;
    failure_ = reason + "; communicator aborted";
    spdlog::error("{}", failure_);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    for (InFlight& p : pending_) cudaEventDestroy(p.done);
    pending_.clear();
  }

  void throw_if_failed() const {
    if (!failure_.empty()) throw Error(failure_);
  }

  void check_nccl(ncclResult_t code, const char* call) const {
    if (code == ncclSuccess) return;
    fail("{} failed on rank {}: {} ({})", call, rank_, ncclGetErrorString(code),
         comm_ ? ncclGetLastError(comm_) : ncclGetLastError(nullptr));
  }

  void check_tensor(const at::Tensor& t, const char* op, const char* what) const {
    if (!t.defined() || !t.is_cuda() || !t.is_contiguous() || t.get_device() != options_.device)
      fail("Communicator(NCCL)::{}: {} must be a defined, contiguous tensor on cuda:{}{}", op, what, options_.device,
           t.defined() ? fmt::format(" (got {} on {})", c10::toString(t.scalar_type()), t.device().str())
                       : std::string(" (got an undefined tensor)"));
  }

  static void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
    if (a.scalar_type() != b.scalar_type())
      fail("Communicator(NCCL)::{}: input is {} but output is {}", op, c10::toString(a.scalar_type()),
           c10::toString(b.scalar_type()));
  }

  MPI_Comm mpi_;
  NcclOptions options_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  int* barrier_word_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> pending_;
  std::string failure_;  // set once, when the communicator is aborted
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, const NcclOptions& options) {
  MPI_Comm owned = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &owned), "MPI_Comm_dup");
  return std::make_unique<NcclCommunicator>(owned, options);
}

}  // namespace ditrl::dist
