// Device tensors over an MPI communicator, staged through host buffers
// (dist/communicator.hpp, make_host_staged_communicator).
//
// Ordering on a GPU (docs/gpus-and-clusters.md, "NCCL and MPI"):
// - device -> host: a blocking copy, which LibTorch issues on the current
//   stream and then synchronizes that stream, so it sees every kernel queued
//   before the collective;
// - the collective: the wrapped MPI communicator on the host copies (its
//   canonical summation tree, dist/reduction.hpp; raw bytes otherwise);
// - host -> device: a non-blocking copy from pinned memory on the stream
//   current at that moment (at once, or at Pending::wait() for *_async), so
//   later kernels on it see the result and the host does not wait for it.
//   An event recorded after it guards the buffer: the next collective that
//   takes the buffer waits for that event before writing into it.
//
// Buffers come from a small pool, one per collective in flight (a unit's
// prefetched gather and several gradient reduce-scatters may overlap), and
// are reused rather than allocated per call: pinned allocations are slow.
// All of it is device-generic ATen, so a CPU build compiles and tests it
// (stage_cpu_tensors).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace ditrl::dist {

namespace {

// One host buffer; `copied_back` is the event after the last copy out of it
// onto a device, not yet known to be complete.
struct Buffer {
  at::Tensor bytes;
  bool pinned = false;
  bool busy = false;
  std::optional<c10::Event> copied_back;
};

class BufferPool {
 public:
  // A free buffer of at least `bytes` (pinned for device tensors), grown or
  // added when none fits; returned to the pool when the shared_ptr's last
  // copy goes.
  std::shared_ptr<Buffer> acquire(int64_t bytes, bool pinned) {
    Buffer* buffer = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      buffer = free_buffer(bytes, pinned);
      buffer->busy = true;
    }
    if (buffer->copied_back) buffer->copied_back->synchronize();
    buffer->copied_back.reset();
    if (buffer->bytes.numel() < bytes)
      buffer->bytes = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
    return std::shared_ptr<Buffer>(buffer, [this](Buffer* b) {
      std::lock_guard<std::mutex> lock(mutex_);
      b->busy = false;
    });
  }

 private:
  // The smallest free buffer that fits, else the largest free one (grown by
  // the caller), else a new one. Caller holds the lock.
  Buffer* free_buffer(int64_t bytes, bool pinned) {
    Buffer* fit = nullptr;
    Buffer* largest = nullptr;
    for (const std::unique_ptr<Buffer>& b : buffers_) {
      if (b->busy || b->pinned != pinned) continue;
      const int64_t size = b->bytes.defined() ? b->bytes.numel() : 0;
      if (size >= bytes && (!fit || size < fit->bytes.numel())) fit = b.get();
      if (!largest || size > largest->bytes.numel()) largest = b.get();
    }
    if (fit) return fit;
    if (largest) return largest;
    buffers_.push_back(std::make_unique<Buffer>());
    buffers_.back()->pinned = pinned;
    buffers_.back()->bytes = at::empty({0}, at::kByte);
    return buffers_.back().get();
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// A tensor's host side for one collective: the tensor itself, or a view of a
// leased buffer that holds (or will hold) its bytes.
struct Staged {
  at::Tensor host;
  std::shared_ptr<Buffer> buffer;  // null when not staged
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host_side, bool stage_cpu_tensors)
      : inner_(std::move(host_side)), stage_cpu_(stage_cpu_tensors) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    const Staged in = stage(input, "all_gather", /*copy_in=*/true);
    Staged out = stage(output, "all_gather", /*copy_in=*/false);
    inner_->all_gather(in.host, out.host);
    copy_back(out, output);
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    const Staged in = stage(input, "reduce_scatter", /*copy_in=*/true);
    Staged out = stage(output, "reduce_scatter", /*copy_in=*/false);
    inner_->reduce_scatter(in.host, out.host, op);
    copy_back(out, output);
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    Staged both = stage(tensor, "all_reduce", /*copy_in=*/true);
    inner_->all_reduce(both.host, op);
    copy_back(both, tensor);
  }

  void all_to_all(const at::Tensor& input, at::Tensor& output) override {
    const Staged in = stage(input, "all_to_all", /*copy_in=*/true);
    Staged out = stage(output, "all_to_all", /*copy_in=*/false);
    inner_->all_to_all(in.host, out.host);
    copy_back(out, output);
  }

  void broadcast(at::Tensor& tensor, int root) override {
    Staged both = stage(tensor, "broadcast", /*copy_in=*/rank() == root);
    inner_->broadcast(both.host, root);
    copy_back(both, tensor);
  }

  void barrier() override { inner_->barrier(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<HostStagedCommunicator>(inner_->split(color, key), stage_cpu_);
  }

  Pending all_gather_async(const at::Tensor& input, const at::Tensor& output) override {
    const Staged in = stage(input, "all_gather_async", /*copy_in=*/true);
    const Staged out = stage(output, "all_gather_async", /*copy_in=*/false);
    return copy_back_at_wait(inner_->all_gather_async(in.host, out.host), in, out, output);
  }

  Pending reduce_scatter_async(const at::Tensor& input, const at::Tensor& output, ReduceOp op) override {
    const Staged in = stage(input, "reduce_scatter_async", /*copy_in=*/true);
    const Staged out = stage(output, "reduce_scatter_async", /*copy_in=*/false);
    return copy_back_at_wait(inner_->reduce_scatter_async(in.host, out.host, op), in, out, output);
  }

 private:
  bool staged(const at::Tensor& t) const { return t.defined() && (!t.device().is_cpu() || stage_cpu_); }

  // The host side of `t`; copy_in: with t's bytes, copied once the current
  // stream's work so far is done (the copy synchronizes the stream).
  Staged stage(const at::Tensor& t, const char* op, bool copy_in) {
    if (!staged(t)) return {t, nullptr};
    if (!t.is_contiguous())
      fail("Communicator(MPI, host-staged)::{}: tensors must be contiguous (got a {} tensor on {})", op,
           c10::toString(t.scalar_type()), t.device().str());
    Staged s;
    s.buffer = pool_.acquire(static_cast<int64_t>(t.nbytes()), /*pinned=*/!t.device().is_cpu());
    s.host = s.buffer->bytes.narrow(0, 0, static_cast<int64_t>(t.nbytes())).view(t.scalar_type()).view(t.sizes());
    if (copy_in) s.host.copy_(t, /*non_blocking=*/false);
    return s;
  }

  // `to` = the collective's result, queued on to's current stream; the
  // buffer's event marks when it may be written again.
  static void copy_back(Staged& from, const at::Tensor& to) {
    if (!from.buffer) return;
    at::Tensor target = to;
    target.copy_(from.host, /*non_blocking=*/!to.device().is_cpu());
    if (to.device().is_cpu()) return;
    const c10::impl::VirtualGuardImpl device(to.device().type());
    from.buffer->copied_back.emplace(to.device().type());
    from.buffer->copied_back->record(device.getStream(to.device()));
  }

  // The inner collective's handle, whose wait() also copies the result back;
  // the input's buffer is held until then (the collective reads it).
  static Pending copy_back_at_wait(Pending inner, Staged in, Staged out, const at::Tensor& output) {
    auto handle = std::make_shared<Pending>(std::move(inner));
    return Pending([handle, in = std::move(in), out = std::move(out), output]() mutable {
      handle->wait();
      copy_back(out, output);
      in.buffer.reset();
      out.buffer.reset();
    });
  }

  std::unique_ptr<Communicator> inner_;
  bool stage_cpu_ = false;
  BufferPool pool_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> host_side,
                                                            bool stage_cpu_tensors) {
  if (!host_side) fail("make_host_staged_communicator: no communicator to stage through");
  return std::make_unique<HostStagedCommunicator>(std::move(host_side), stage_cpu_tensors);
}

}  // namespace ditrl::dist
