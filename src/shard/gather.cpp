// Unit gathers into pooled buffers, with a prefetch of the next unit on the async lane.

#include <ditrl/clock.hpp>
#include <ditrl/shard/gather.hpp>

#include <ATen/ATen.h>

#include <algorithm>

namespace ditrl::shard {

namespace {

// Every group's full tensor starts on a 64-byte boundary of the buffer.
int64_t aligned(int64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

at::Tensor bytes_of(const c10::Storage& storage) {
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
}

// Moves `from`'s bytes into `to`'s storage (the memory itself stays where it
// is, so views of `to` see them) and returns a byte tensor over all of it;
// `from`'s storage is left empty.
at::Tensor move_bytes(const at::Tensor& from, const at::Tensor& to) {
  c10::StorageImpl* source = from.storage().unsafeGetStorageImpl();
  c10::StorageImpl* target = to.storage().unsafeGetStorageImpl();
  const size_t bytes = source->nbytes();
  target->set_data_ptr_noswap(source->set_data_ptr(at::DataPtr(nullptr, source->device())));
  target->set_nbytes(bytes);
  source->set_nbytes(0);
  return bytes_of(to.storage());
}

}  // namespace

at::Tensor BufferPool::take(int64_t bytes) {
  auto best = buffers_.end();
  for (auto it = buffers_.begin(); it != buffers_.end(); ++it)
    if (it->numel() >= bytes && (best == buffers_.end() || it->numel() < best->numel())) best = it;
  if (best == buffers_.end()) return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
  at::Tensor buffer = *best;
  buffers_.erase(best);
  return buffer;
}

void BufferPool::recycle(at::Tensor buffer) {
  if (!buffer.defined() || buffer.storage().use_count() != 1) return;
  buffers_.push_back(std::move(buffer));
  if (buffers_.size() > kBuffers)
    buffers_.erase(std::min_element(buffers_.begin(), buffers_.end(),
                                    [](const at::Tensor& a, const at::Tensor& b) { return a.numel() < b.numel(); }));
}

UnitGather::UnitGather(const Layout& layout, const Slices& slices, dist::Communicator& comm, bool prefetch)
    : layout_(layout),
      slices_(slices),
      comm_(comm),
      prefetch_(prefetch && comm.size() > 1),
      pool_(slices.device),
      units_(layout.units.size()) {}

UnitGather::~UnitGather() {
  try {
    drop_prefetch();
  } catch (...) {
    // A failed prefetch is reported where it is consumed; here it is only joined.
  }
}

int64_t UnitGather::buffer_bytes(size_t unit) const {
  int64_t bytes = 0;
  for (const FlatGroup& g : layout_.units[unit].groups) bytes += aligned(g.gathered_bytes(comm_.size()));
  return bytes;
}

UnitGather::Gathered UnitGather::start_gather(size_t unit, at::Tensor buffer, bool async) {
  Gathered gathered{std::move(buffer), {}, {}};
  int64_t offset = 0;
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t bytes = groups[g].gathered_bytes(comm_.size());
    at::Tensor full = gathered.buffer.narrow(0, offset, bytes).view(groups[g].compute);
    const at::Tensor& mine = slices_.units[unit][g].compute;
    if (async)
      gathered.pending.push_back(comm_.all_gather_async(mine, full));
    else
      comm_.all_gather(mine, full);
    gathered.groups.push_back(full);
    offset += aligned(bytes);
  }
  return gathered;
}

void UnitGather::gather(size_t unit) {
  Gathered& slot = units_[unit];
  if (gathered(unit) || layout_.units[unit].groups.empty()) return;
  if (comm_.size() == 1) {
    slot = in_place(unit);
    point_params(unit);
    return;
  }
  const auto start = Clock::now();
  Gathered fresh = take_gather(unit);
  if (slot.evicted) {
    // Same layout, same offsets: the fresh bytes are what slot.groups view.
    slot.buffer = move_bytes(fresh.buffer, slot.buffer);
    slot.evicted = false;
  } else {
    slot = std::move(fresh);
  }
  seconds_ += seconds_since(start);
  point_params(unit);
}

UnitGather::Gathered UnitGather::in_place(size_t unit) const {
  Gathered gathered;
  for (const GroupSlices& gs : slices_.units[unit]) gathered.groups.push_back(gs.compute);
  gathered.buffer = gathered.groups.front();  // marks the unit gathered; it has nothing to recycle
  gathered.in_place = true;
  return gathered;
}

// The unit's gathered bytes: the matching prefetch, waited for, or a
// synchronous gather.
UnitGather::Gathered UnitGather::take_gather(size_t unit) {
  if (pending_ && pending_->unit == unit) {
    Gathered fresh = std::move(pending_->gathered);  // its bytes were counted when it was started
    pending_.reset();
    for (dist::Pending& p : fresh.pending) p.wait();
    fresh.pending.clear();
    return fresh;
  }
  drop_prefetch();
  track(layout_.units[unit].gathered_bytes(comm_.size()));
  return start_gather(unit, pool_.take(buffer_bytes(unit)), /*async=*/false);
}

// Every rank makes the same gather calls, so every rank starts and consumes
// the same prefetches in the same order.
void UnitGather::prefetch(size_t unit) {
  if (!prefetch_ || unit >= layout_.root_index() || gathered(unit) || layout_.units[unit].groups.empty() ||
      (pending_ && pending_->unit == unit))
    return;
  drop_prefetch();
  track(layout_.units[unit].gathered_bytes(comm_.size()));
  pending_ = std::make_unique<Prefetch>();
  pending_->unit = unit;
  pending_->gathered = start_gather(unit, pool_.take(buffer_bytes(unit)), /*async=*/true);
}

void UnitGather::drop_prefetch() {
  if (!pending_) return;
  std::unique_ptr<Prefetch> dropped = std::move(pending_);
  track(-layout_.units[dropped->unit].gathered_bytes(comm_.size()));
  for (dist::Pending& p : dropped->gathered.pending) p.wait();
  dropped->gathered.groups.clear();
  pool_.recycle(std::move(dropped->gathered.buffer));
}

void UnitGather::point_params(size_t unit) {
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Slot& slot : groups[g].slots)
      slot.param.set_data(units_[unit].groups[g].narrow(0, slot.offset, slot.numel).view(slot.shape));
}

// Empty placeholders, so that a released or evicted unit's parameters never
// view bytes it no longer holds.
void UnitGather::unpoint_params(size_t unit) {
  for (const FlatGroup& g : layout_.units[unit].groups)
    for (const Slot& s : g.slots) s.param.set_data(placeholder(g.compute, slices_.device));
}

void UnitGather::release(size_t unit) {
  Gathered& slot = units_[unit];
  // In place, the parameters view the unit's own compute slices, which live
  // as long as this object and are only ever updated in place: they stay
  // pointed, and later gathers cost nothing (re-pointing every parameter on
  // each use was 12% of a tiny SD3 step's ATen calls).
  if (!slot.buffer.defined() || slot.in_place) return;
  unpoint_params(unit);
  Gathered released = std::move(slot);
  slot = Gathered{};
  // Evicted: no bytes to recycle (its graph still holds the empty storage).
  if (released.evicted) return;
  released.groups.clear();
  pool_.recycle(std::move(released.buffer));
  track(-layout_.units[unit].gathered_bytes(comm_.size()));
}

void UnitGather::evict(size_t unit) {
  Gathered& slot = units_[unit];
  if (!gathered(unit) || slot.in_place) return;  // in place there are no gathered bytes to free
  unpoint_params(unit);
  pool_.recycle(move_bytes(slot.buffer, at::empty({0}, at::TensorOptions().dtype(at::kByte).device(slices_.device))));
  slot.evicted = true;
  track(-layout_.units[unit].gathered_bytes(comm_.size()));
}

void UnitGather::release_all() {
  drop_prefetch();
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

void UnitGather::track(int64_t delta) {
  bytes_ += delta;
  peak_bytes_ = std::max(peak_bytes_, bytes_);
}

}  // namespace ditrl::shard
