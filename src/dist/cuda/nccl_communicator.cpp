// NCCL backend of dist::Communicator (see dist/nccl_communicator.hpp).
//
// Collectives run on the communicator's own stream, ordered after LibTorch's
// current CUDA stream (the compute stream) by an event; the compute stream
// waits for a collective's completion event at once (synchronous forms) or
// when the Pending handle is waited on (*_async), so nothing blocks the host.
//
// Deterministic reductions (NcclOptions::deterministic) never use NCCL's
// reduction kernels, whose order of additions depends on the algorithm and
// topology NCCL picks: each rank receives the chunks it owns from every rank
// (grouped ncclSend/ncclRecv, an all-to-all) and adds them on its stream in
// the canonical tree order of dist/reduction.hpp, accumulating like the MPI
// backend (fp32 for 16-bit floats), so the result is bitwise the MPI
// backend's for the same inputs.
//
// The NCCL communicator is non-blocking (config.blocking = 0): every NCCL
// call returns at once, possibly with ncclInProgress, so a host thread never
// sits inside NCCL where a dead peer could hold it forever. All NCCL calls
// and the watchdog's checks hold one mutex; ncclCommAbort from the watchdog
// therefore never races a call on the main thread.

#include <ditrl/dist/mpi_error.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
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

// A collective's completion, shared by the watchdog and a Pending handle.
class Event {
 public:
  Event() { check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// output = the chunks [ranks, n] reduced: the extremum, or the canonical tree
// sum of the MPI backend (dist/reduction.hpp).
void reduce_chunks(const at::Tensor& chunks, at::Tensor& output, ReduceOp op) {
  if (op == ReduceOp::Max || op == ReduceOp::Min) return extremum_of_chunks(chunks, output, op);
  tree_sum_of_chunks(chunks, output, op == ReduceOp::Avg);
}

class NcclCommunicator final : public Communicator {
 public:
  // `channel` names it to the watchdog: the same on every rank of this
  // communicator, different from every other communicator's.
  NcclCommunicator(MPI_Comm owned, const NcclOptions& options, std::string channel)
      : mpi_(owned), options_(options), channel_(std::move(channel)) {
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
    wait_on_compute(issue_all_gather(input, output));
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    wait_on_compute(issue_reduce_scatter(input, output, op));
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce", "tensor");
    check_reducible("NCCL", tensor.scalar_type(), op);
    if (!options_.deterministic) {
      const ncclDataType_t dtype = nccl_dtype(tensor.scalar_type());
      wait_on_compute(enqueue("all_reduce", {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dtype, nccl_op(op), comm, stream);
      }));
      return;
    }
    // Every rank gathers every copy and reduces them in the canonical order: the same
    // sums as the MPI backend's reduce-scatter + all-gather.
    const at::Tensor flat = tensor.view({-1});
    at::Tensor copies = at::empty({size_, flat.numel()}, tensor.options());
    wait_on_compute(issue_all_gather(flat, copies));
    at::Tensor out = tensor;
    reduce_chunks(copies, out, op);
  }

  // Grouped ncclSend/ncclRecv of raw bytes: NCCL has no all-to-all call.
  void all_to_all(const at::Tensor& input, at::Tensor& output) override {
    check_tensor(input, "all_to_all", "input");
    check_tensor(output, "all_to_all", "output");
    check_same_dtype(input, output, "all_to_all");
    if (input.numel() != output.numel() || input.numel() % size_ != 0)
      fail(
          "Communicator(NCCL)::all_to_all: input has {} and output {} elements, expected equal counts divisible by {} "
          "ranks",
          input.numel(), output.numel(), size_);
    wait_on_compute(enqueue("all_to_all", {input, output}, [&](ncclComm_t comm, cudaStream_t stream) {
      return send_recv_chunks(input, output, comm, stream);
    }));
  }

  void broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast", "tensor");
    if (root < 0 || root >= size_) fail("Communicator(NCCL)::broadcast: root {} outside [0, {})", root, size_);
    wait_on_compute(enqueue("broadcast", {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.nbytes(), ncclUint8, root, comm, stream);
    }));
  }

  // An all-reduce of one integer that the host waits for: every rank has
  // reached it when it returns (or the watchdog's timeout throws).
  void barrier() override {
    // The collective's own WaitScope (enqueue) stays open while the host
    // waits: an overrun names the ranks that have not reached it.
    enqueue("barrier", {}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm, stream);
    });
    wait_for_stream();
  }

  Pending all_gather_async(const at::Tensor& input, const at::Tensor& output) override {
    return stream_wait(issue_all_gather(input, output));
  }
  Pending reduce_scatter_async(const at::Tensor& input, const at::Tensor& output, ReduceOp op) override {
    return stream_wait(issue_reduce_scatter(input, output, op));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("Communicator(NCCL)::split: color must be >= 0 (got {})", color);
    MPI_Comm sub = MPI_COMM_NULL;
    {
      // Blocking MPI collectives run under the watchdog (dist/watchdog.hpp),
      // as the MPI backend's split does: a peer that never arrives is named.
      WaitScope waiting(channel_, "MPI_Comm_split");
      check_mpi(MPI_Comm_split(mpi_, color, key, &sub), "MPI_Comm_split");
    }
    return std::make_unique<NcclCommunicator>(sub, options_, fmt::format("{}/split{}", channel_, color));
  }

 private:
  // A collective issued and not yet complete on the device. Its WaitScope
  // stays open until then, so the process watchdog counts it and, when it
  // overruns, names the ranks that have not issued it.
  struct InFlight {
    std::shared_ptr<Event> done;
    std::string what;
    Clock::time_point deadline;
    std::shared_ptr<WaitScope> scope;
  };

  // While a process watchdog runs, it reports an overrun first (asking every
  // peer what it is doing takes up to its reply wait); this communicator's
  // own deadline is then the backstop.
  Clock::time_point collective_deadline() const {
    return deadline_after(options_.collective_timeout_s + (Watchdog::running() ? 30.0 : 0.0));
  }

  std::shared_ptr<Event> issue_all_gather(const at::Tensor& input, const at::Tensor& output) {
    check_tensor(input, "all_gather", "input");
    check_tensor(output, "all_gather", "output");
    check_same_dtype(input, output, "all_gather");
    if (output.numel() != input.numel() * size_)
      fail("Communicator(NCCL)::all_gather: output has {} elements, expected {} ranks x {}", output.numel(), size_,
           input.numel());
    // Raw bytes: any dtype gathers bit-exactly.
    return enqueue("all_gather", {input, output}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.nbytes(), ncclUint8, comm, stream);
    });
  }

  std::shared_ptr<Event> issue_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op) {
    check_tensor(input, "reduce_scatter", "input");
    check_tensor(output, "reduce_scatter", "output");
    check_same_dtype(input, output, "reduce_scatter");
    check_reducible("NCCL", input.scalar_type(), op);
    if (input.numel() != output.numel() * size_)
      fail("Communicator(NCCL)::reduce_scatter: input has {} elements, expected {} ranks x {}", input.numel(), size_,
           output.numel());
    if (!options_.deterministic) {
      const ncclDataType_t dtype = nccl_dtype(input.scalar_type());
      return enqueue("reduce_scatter", {input, output}, [&](ncclComm_t comm, cudaStream_t stream) {
        return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), dtype, nccl_op(op), comm, stream);
      });
    }
    at::Tensor chunks;
    return enqueue(
        "reduce_scatter", {input, output},
        [&](ncclComm_t comm, cudaStream_t stream) {
          chunks = at::empty({size_, output.numel()}, output.options());  // on the communication stream
          return send_recv_chunks(input, chunks, comm, stream);
        },
        [&] {
          at::Tensor out = output;
          reduce_chunks(chunks, out, op);
        });
  }

  // Chunk r of `send` to rank r and chunk r of `recv` from rank r, grouped
  // (an all-to-all of raw bytes).
  ncclResult_t send_recv_chunks(const at::Tensor& send, const at::Tensor& recv, ncclComm_t comm,
                                cudaStream_t stream) const {
    const int64_t bytes = send.nbytes() / size_;
    auto* from = static_cast<const char*>(send.data_ptr());
    auto* to = static_cast<char*>(recv.data_ptr());
    ncclResult_t state = ncclGroupStart();
    for (int peer = 0; peer < size_ && state == ncclSuccess; ++peer) {
      state = ncclSend(from + peer * bytes, bytes, ncclUint8, peer, comm, stream);
      if (state == ncclSuccess) state = ncclRecv(to + peer * bytes, bytes, ncclUint8, peer, comm, stream);
    }
    const ncclResult_t ended = ncclGroupEnd();
    return state == ncclSuccess ? ended : state;
  }

  void wait_on_compute(const std::shared_ptr<Event>& done) const {
    check_cuda(cudaStreamWaitEvent(compute_stream(options_.device), done->get(), 0), "cudaStreamWaitEvent");
  }

  // The handle's wait() orders the stream current at that moment after the
  // collective; the host does not block.
  Pending stream_wait(std::shared_ptr<Event> done) const {
    return Pending([this, done = std::move(done)] { wait_on_compute(done); });
  }

  void open() {
    check_mpi(MPI_Comm_rank(mpi_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(mpi_, &size_), "MPI_Comm_size");
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    {
      // Under the watchdog: a rank 0 that fails or hangs before the broadcast
      // would otherwise hold every peer here with no scope open to time out.
      WaitScope waiting(channel_, "MPI_Bcast(ncclUniqueId)");
      check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_), "MPI_Bcast(ncclUniqueId)");
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&barrier_word_), sizeof(int)), "cudaMalloc");
    check_cuda(cudaMemset(barrier_word_, 0, sizeof(int)), "cudaMemset");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const Clock::time_point deadline = deadline_after(options_.startup_timeout_s);
    WaitScope waiting(channel_, "ncclCommInitRankConfig");
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
  // hands its completion event to the watchdog. `then` (kernels of ours on the
  // communication stream after the NCCL call) runs before the event is recorded.
  // The tensors are marked as used by the communication stream, so the caching
  // allocator never hands their memory out before the collective is done.
  template <class Call>
  std::shared_ptr<Event> enqueue(const char* what, std::initializer_list<at::Tensor> tensors, Call call,
                                 const std::function<void()>& then = {}) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_failed();
    auto scope = std::make_shared<WaitScope>(channel_, what);
    const Clock::time_point deadline = collective_deadline();
    check_cuda(cudaSetDevice(options_.device), "cudaSetDevice");
    check_cuda(cudaEventRecord(ready_, compute_stream(options_.device)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    const c10::cuda::CUDAStream side =
        c10::cuda::getStreamFromExternal(stream_, static_cast<c10::DeviceIndex>(options_.device));
    for (const at::Tensor& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      const ncclResult_t issued = call(comm_, stream_);
      wait_in_progress(lock, issued, what, deadline, options_.collective_timeout_s);
      if (then) then();
    }
    auto done = std::make_shared<Event>();
    check_cuda(cudaEventRecord(done->get(), stream_), "cudaEventRecord");
    pending_.push_back({done, what, deadline, std::move(scope)});
    lock.unlock();
    wake_.notify_all();
    return done;
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
        const cudaError_t state = cudaEventQuery(pending_.front().done->get());
        if (state == cudaErrorNotReady) break;
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
  std::string channel_;
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
  const std::string channel = "nccl";
  MPI_Comm owned = MPI_COMM_NULL;
  {
    WaitScope waiting(channel, "create");
    check_mpi(MPI_Comm_dup(comm, &owned), "MPI_Comm_dup");
  }
  return std::make_unique<NcclCommunicator>(owned, options, channel);
}

}  // namespace ditrl::dist
