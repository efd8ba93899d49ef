// MPI backend of dist::Communicator for CPU tensors.
//
// Data moves as raw bytes (MPI_BYTE), so every dtype travels bit-exactly,
// bf16 and fp16 included, which MPI has no datatype for. Reductions never use
// MPI's reduction operators: their grouping of additions depends on the
// algorithm Open MPI picks for a message size and rank count. Instead every
// rank receives the chunks it owns from all ranks (MPI_Alltoall of raw bytes)
// and sums them itself in the canonical tree order of dist/reduction.hpp:
//
//   2 ranks: c0 + c1;  4 ranks: (c0 + c2) + (c1 + c3);  3 ranks: (c0 + c1) + c2   [then / N for Avg]
//
// accumulating in fp32 for fp32/bf16/fp16 inputs (fp64 for fp64, the integer
// type itself for integers) and rounding once to the output dtype. The result
// is therefore a function of the rank count and the data only: bitwise the
// same whatever algorithm MPI uses, on every run. all_reduce is that
// reduce-scatter followed by an all-gather, so it is deterministic too.
//
// One thread at a time per communicator (MPI orders collectives per
// communicator). The *_async forms run in issue order on a lane: a thread of
// the communicator's own with a duplicated MPI communicator, so a gather
// proceeds while the caller computes. Without MPI_THREAD_MULTIPLE, or alone,
// they run at once on the caller's thread.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/mpi_error.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ditrl::dist {

namespace {

void check_cpu_contiguous(const at::Tensor& t, const char* op, const char* what) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous())
    fail("Communicator(MPI)::{}: {} must be a defined, contiguous CPU tensor{}", op, what,
         t.defined() ? fmt::format(" (got {} on {}, contiguous={})", c10::toString(t.scalar_type()), t.device().str(),
                                   t.is_contiguous())
                     : std::string(" (got an undefined tensor)"));
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  if (a.scalar_type() != b.scalar_type())
    fail("Communicator(MPI)::{}: input is {} but output is {}", op, c10::toString(a.scalar_type()),
         c10::toString(b.scalar_type()));
}

// MPI counts are ints; a message per rank above 2 GiB must be split by the caller.
int byte_count(int64_t bytes, const char* op) {
  if (bytes > INT_MAX)
    fail("Communicator(MPI)::{}: {} bytes per rank exceed MPI's int count; split the message", op, bytes);
  return static_cast<int>(bytes);
}

int64_t padded_to(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// The accumulation type of a sum: fp32 for 16-bit floats, the type itself
// otherwise (integers wrap as in torch).
template <class T>
struct Accumulate {
  using type = T;
};
template <>
struct Accumulate<c10::BFloat16> {
  using type = float;
};
template <>
struct Accumulate<c10::Half> {
  using type = float;
};

// out[i] = the canonical tree sum (dist/reduction.hpp) of chunks[order[p]][i]
// over leaves p [/ ranks], rounded once to T. Blocks of elements keep every
// chunk a sequential stream; each element's order is fixed, so the threads'
// split changes nothing.
template <class T>
void sum_chunks(const T* chunks, T* out, int64_t n, int ranks, bool average) {
  using Acc = typename Accumulate<T>::type;
  constexpr int64_t kBlock = 2048;
  const std::vector<int> order = chunk_leaf_order(ranks);
  int depth = 1;
  while ((1 << (depth - 1)) < ranks) ++depth;
  at::parallel_for(0, (n + kBlock - 1) / kBlock, 16, [&](int64_t first, int64_t last) {
    // One accumulator per tree level: a node sums into its level's row, its
    // right child into the next row.
    std::vector<Acc> rows(static_cast<size_t>(depth) * kBlock);
    for (int64_t block = first; block < last; ++block) {
      const int64_t begin = block * kBlock, count = std::min(kBlock, n - begin);
      const auto node = [&](const auto& self, int lo, int hi, Acc* acc) -> void {
        if (hi - lo == 1) {
          const T* chunk = chunks + static_cast<int64_t>(order[static_cast<size_t>(lo)]) * n + begin;
          for (int64_t i = 0; i < count; ++i) acc[i] = static_cast<Acc>(chunk[i]);
          return;
        }
        const int split = lo + static_cast<int>(tree_split(hi - lo));
        self(self, lo, split, acc);
        self(self, split, hi, acc + kBlock);
        for (int64_t i = 0; i < count; ++i) acc[i] += acc[kBlock + i];
      };
      Acc* acc = rows.data();
      node(node, 0, ranks, acc);
      if (average)
        for (int64_t i = 0; i < count; ++i) acc[i] /= static_cast<Acc>(ranks);
      for (int64_t i = 0; i < count; ++i) out[begin + i] = static_cast<T>(acc[i]);
    }
  });
}

// Runs collectives on its own thread and communicator, first in, first out.
class Lane {
 public:
  explicit Lane(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)), thread_([this] { loop(); }) {}
  ~Lane() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    // While an error unwinds, a peer may never arrive: the job is aborted
    // by main(), so the thread is not waited for.
    if (std::uncaught_exceptions() > 0)
      thread_.detach();
    else
      thread_.join();
  }
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  Pending submit(std::function<void(Communicator&)> op) {
    auto task = std::make_shared<std::packaged_task<void()>>([this, op = std::move(op)] { op(*comm_); });
    auto done = std::make_shared<std::future<void>>(task->get_future());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back([task] { (*task)(); });
    }
    wake_.notify_one();
    return Pending([done] { done->get(); });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::unique_ptr<Communicator> comm_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

bool mpi_thread_multiple() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_MULTIPLE;
}

class MpiCommunicator final : public Communicator {
 public:
  // with_lane: also duplicate the communicator for the *_async lane
  // (collective, like the duplication itself).
  // `channel` names it in the watchdog's reports.
  MpiCommunicator(MPI_Comm owned, std::string channel, bool with_lane) : comm_(owned), channel_(std::move(channel)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    if (with_lane && size_ > 1 && mpi_thread_multiple()) {
      MPI_Comm lane = MPI_COMM_NULL;
      check_mpi(MPI_Comm_dup(comm_, &lane), "MPI_Comm_dup");
      lane_ = std::make_unique<Lane>(std::make_unique<MpiCommunicator>(lane, channel_ + "/lane", /*with_lane=*/false));
    }
  }
  ~MpiCommunicator() override {
    lane_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    check_cpu_contiguous(input, "all_gather", "input");
    check_cpu_contiguous(output, "all_gather", "output");
    check_same_dtype(input, output, "all_gather");
    if (output.numel() != input.numel() * size_)
      fail("Communicator(MPI)::all_gather: output has {} elements, expected {} ranks x {}", output.numel(), size_,
           input.numel());
    const int bytes = byte_count(input.nbytes(), "all_gather");
    WaitScope waiting(channel_, "all_gather");
    check_mpi(MPI_Allgather(input.data_ptr(), bytes, MPI_BYTE, output.data_ptr(), bytes, MPI_BYTE, comm_),
              "MPI_Allgather");
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    check_cpu_contiguous(input, "reduce_scatter", "input");
    check_cpu_contiguous(output, "reduce_scatter", "output");
    check_same_dtype(input, output, "reduce_scatter");
    if (input.numel() != output.numel() * size_)
      fail("Communicator(MPI)::reduce_scatter: input has {} elements, expected {} ranks x {}", input.numel(), size_,
           output.numel());
    check_reducible("MPI", input.scalar_type(), op);
    const int bytes = byte_count(output.nbytes(), "reduce_scatter");
    void* chunks = scratch(input.nbytes());
    WaitScope waiting(channel_, "reduce_scatter");
    check_mpi(MPI_Alltoall(input.data_ptr(), bytes, MPI_BYTE, chunks, bytes, MPI_BYTE, comm_), "MPI_Alltoall");
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      AT_DISPATCH_ALL_TYPES_AND2(at::kBFloat16, at::kHalf, output.scalar_type(), "reduce_scatter", [&] {
        sum_chunks(static_cast<const scalar_t*>(chunks), output.data_ptr<scalar_t>(), output.numel(), size_,
                   op == ReduceOp::Avg);
      });
    } else {
      extremum_of_chunks(at::from_blob(chunks, {size_, output.numel()}, output.options()), output, op);
    }
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_cpu_contiguous(tensor, "all_reduce", "tensor");
    check_reducible("MPI", tensor.scalar_type(), op);
    const int64_t n = tensor.numel();
    const int64_t padded = padded_to(std::max<int64_t>(n, 1), size_);
    at::Tensor flat = tensor.view({-1});
    if (padded != n) flat = at::cat({flat, at::zeros({padded - n}, tensor.options())});
    at::Tensor mine = at::empty({padded / size_}, tensor.options());
    reduce_scatter(flat, mine, op);
    at::Tensor gathered = padded == n ? flat : at::empty({padded}, tensor.options());
    all_gather(mine, gathered);
    if (padded != n) tensor.view({-1}).copy_(gathered.narrow(0, 0, n));
  }

  void broadcast(at::Tensor& tensor, int root) override {
    check_cpu_contiguous(tensor, "broadcast", "tensor");
    if (root < 0 || root >= size_) fail("Communicator(MPI)::broadcast: root {} outside [0, {})", root, size_);
    WaitScope waiting(channel_, "broadcast");
    check_mpi(MPI_Bcast(tensor.data_ptr(), byte_count(tensor.nbytes(), "broadcast"), MPI_BYTE, root, comm_),
              "MPI_Bcast");
  }

  void barrier() override {
    WaitScope waiting(channel_, "barrier");
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("Communicator(MPI)::split: color must be >= 0 (got {})", color);
    MPI_Comm sub = MPI_COMM_NULL;
    {
      WaitScope waiting(channel_, "split");
      check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    }
    return std::make_unique<MpiCommunicator>(sub, fmt::format("{}/split{}", channel_, color), /*with_lane=*/true);
  }

  Pending all_gather_async(const at::Tensor& input, const at::Tensor& output) override {
    if (!lane_) {
      at::Tensor out = output;
      all_gather(input, out);
      return {};
    }
    return lane_->submit(
        [input, out = at::Tensor(output)](Communicator& lane) mutable { lane.all_gather(input, out); });
  }

  Pending reduce_scatter_async(const at::Tensor& input, const at::Tensor& output, ReduceOp op) override {
    if (!lane_) {
      at::Tensor out = output;
      reduce_scatter(input, out, op);
      return {};
    }
    return lane_->submit(
        [input, out = at::Tensor(output), op](Communicator& lane) mutable { lane.reduce_scatter(input, out, op); });
  }

 private:
  // Receive buffer kept between calls: a fresh multi-MiB allocation per call
  // costs its page faults every time.
  void* scratch(int64_t bytes) {
    if (scratch_.numel() < bytes) scratch_ = at::empty({bytes}, at::kByte);
    return scratch_.data_ptr();
  }

  MPI_Comm comm_;
  std::string channel_;
  int rank_ = 0;
  int size_ = 1;
  at::Tensor scratch_ = at::empty({0}, at::kByte);
  std::unique_ptr<Lane> lane_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& channel) {
  MPI_Comm owned = MPI_COMM_NULL;
  {
    WaitScope waiting(channel, "create");
    check_mpi(MPI_Comm_dup(comm, &owned), "MPI_Comm_dup");
  }
  return std::make_unique<MpiCommunicator>(owned, channel, /*with_lane=*/true);
}

}  // namespace ditrl::dist
