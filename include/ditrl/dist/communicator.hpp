#pragma once

// Collectives over torch tensors, one interface for two backends: MPI for CPU
// tensors (this file's make_mpi_communicator; make_host_staged_communicator
// carries device tensors over it) and NCCL for CUDA tensors
// (dist/nccl_communicator.hpp, CUDA builds only). Every rank of the group
// calls each collective in the same order with tensors of equal size.
//
// The *_async forms return a Pending handle instead of waiting: the
// collective runs behind the caller's work (MPI: on the communicator's own
// thread and duplicated communicator, in issue order; NCCL: on its stream)
// and its output may be read once wait() returned. The tensors must stay
// alive and untouched until then (the handle holds references to them).

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

namespace ditrl::dist {

enum class ReduceOp { Sum, Avg, Max, Min };

// A collective in flight. A handle dropped without wait() waits in its
// destructor (errors there are left to the next collective to report).
class Pending {
 public:
  Pending() = default;  // nothing in flight
  explicit Pending(std::function<void()> wait) : wait_(std::move(wait)) {}
  Pending(Pending&&) = default;
  Pending& operator=(Pending&& other) noexcept;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending();

  void wait();

 private:
  void wait_quietly() noexcept;
  std::function<void()> wait_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // output (size() * input.numel() elements, contiguous) = every rank's
  // input concatenated in rank order.
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // input has size() * output.numel() elements; rank r receives the
  // reduction of every rank's r-th chunk.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // input and output have size() equal chunks (contiguous, same dtype and
  // numel): chunk r of input goes to rank r, chunk r of output comes from
  // rank r. Raw bytes, so any dtype moves bit-exactly.
  virtual void all_to_all(const at::Tensor& input, at::Tensor& output) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // A sub-communicator of the ranks passing the same color, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  virtual Pending all_gather_async(const at::Tensor& input, const at::Tensor& output) = 0;
  virtual Pending reduce_scatter_async(const at::Tensor& input, const at::Tensor& output, ReduceOp op) = 0;
};

// MPI backend over `comm` (duplicated, so the communicator owns its own
// message space). CPU tensors of any dtype. Each blocking call runs under the
// collective watchdog (dist/watchdog.hpp) as `channel`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, const std::string& channel = "mpi");

// `host_side` (an MPI communicator) for tensors on any device, as gloo serves
// CUDA tensors in PyTorch ([parallel] data_backend = "mpi"): a device tensor is
// copied into a pinned host buffer once the current stream's work before it
// is done, reduced or moved there, and copied back on the current stream; CPU
// tensors pass straight through. The sums are therefore host_side's, bit for
// bit (the canonical tree of dist/reduction.hpp). *_async forms run the
// collective behind the caller's work and copy back at Pending::wait().
// Buffers are kept for reuse, one per collective in flight.
// stage_cpu_tensors: stage CPU tensors too, through pageable buffers (tests
// of the staging without a GPU).
std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> host_side,
                                                            bool stage_cpu_tensors = false);

}  // namespace ditrl::dist
