#pragma once

// Just-in-time gathers of wrap units (docs/design.md §3): a unit's compute slices
// are all-gathered into one byte buffer holding every group's full tensor,
// the module's parameters are pointed at views of it while the unit runs,
// and the buffer goes back to a pool when the unit is released. On one rank
// the slices are the full tensors: the parameters view them in place, from
// the first gather on (release leaves them pointed; nothing is freed). The next
// unit can be gathered ahead of use (prefetch), behind the caller's compute.
// All ranks make the same calls in the same order (they are collectives).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/layout.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ditrl::shard {

// Released gather buffers, reused: page-faulting a fresh multi-MiB buffer on
// every gather can cost more than the gather itself. The root and two units
// are live at once at most.
class BufferPool {
 public:
  explicit BufferPool(c10::Device device) : device_(device) {}
  // The smallest pooled buffer of at least `bytes`, or a new one.
  at::Tensor take(int64_t bytes);
  // A buffer still referenced elsewhere (say, an output viewing a parameter)
  // is left to its holders instead of being overwritten by a later gather.
  void recycle(at::Tensor buffer);

 private:
  static constexpr size_t kBuffers = 3;
  c10::Device device_;
  std::vector<at::Tensor> buffers_;
};

class UnitGather {
 public:
  // prefetch: gather the next unit ahead of use (ignored on one rank, where
  // a gather is a local copy with nothing to hide behind).
  UnitGather(const Layout& layout, const Slices& slices, dist::Communicator& comm, bool prefetch);
  ~UnitGather();
  UnitGather(const UnitGather&) = delete;
  UnitGather& operator=(const UnitGather&) = delete;

  // Gathers `unit` (a no-op when it is gathered; takes a matching prefetch)
  // and points its parameters at the full tensors.
  void gather(size_t unit);
  // Starts gathering `unit` (a wrap unit) for a later gather().
  void prefetch(size_t unit);
  // Points the unit's parameters at empty placeholders and recycles its
  // buffer; an in-place unit (one rank) stays as it is.
  void release(size_t unit);
  // Frees a gathered unit's bytes but keeps its buffer's storage, which views
  // saved by autograd still reference (a unit that kept its graph, FSDP2's
  // reshard of unsharded parameters): the next gather() of the unit puts the
  // gathered bytes back into that same storage.
  void evict(size_t unit);
  // Releases every unit and drops an unused prefetch.
  void release_all();
  bool gathered(size_t unit) const { return units_[unit].buffer.defined() && !units_[unit].evicted; }

  // Most bytes gathered at once so far.
  int64_t peak_bytes() const { return peak_bytes_; }
  // Wall seconds blocked in gathers (not hidden by a prefetch).
  double seconds() const { return seconds_; }

 private:
  struct Gathered {
    at::Tensor buffer;  // undefined = released
    std::vector<at::Tensor> groups;
    std::vector<dist::Pending> pending;  // the gathers still in flight
    bool evicted = false;                // buffer's storage holds no bytes (evict)
    bool in_place = false;               // one rank: the groups are its compute slices, nothing copied
  };
  struct Prefetch {
    size_t unit = 0;
    Gathered gathered;
  };

  int64_t buffer_bytes(size_t unit) const;
  Gathered start_gather(size_t unit, at::Tensor buffer, bool async);
  Gathered take_gather(size_t unit);
  Gathered in_place(size_t unit) const;
  void drop_prefetch();
  void point_params(size_t unit);
  void unpoint_params(size_t unit);
  void track(int64_t delta);

  const Layout& layout_;
  const Slices& slices_;
  dist::Communicator& comm_;
  bool prefetch_;
  BufferPool pool_;
  std::vector<Gathered> units_;
  std::unique_ptr<Prefetch> pending_;
  int64_t bytes_ = 0;
  int64_t peak_bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace ditrl::shard
