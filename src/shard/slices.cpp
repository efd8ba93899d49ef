// A rank's slices of the flat groups, taken from a module's parameters.

#include <ditrl/clock.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/parameter_source.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <set>

namespace ditrl::shard {

at::TensorOptions Slices::on(c10::ScalarType dtype) const {
  return at::TensorOptions().dtype(dtype).device(device);
}

at::Tensor slot_part(const at::Tensor& shard_tensor, const FlatGroup& group, const Slot& slot, int rank,
                     std::pair<int64_t, int64_t> range) {
  return shard_tensor.narrow(0, slot.offset + range.first - rank * group.shard, range.second - range.first);
}

at::Tensor placeholder(c10::ScalarType dtype, c10::Device device) {
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
}

namespace {

// Fills this rank's part of every meta slot from `source`, in the source's
// order (a seeded source draws in registration order, which is not the
// layout's: the root unit comes last). A source whose reads are independent
// (a checkpoint's preads) is read by the intra-op threads at once: filling
// fresh slices is bound by the kernel faulting their pages in, one core's
// worth per thread, so a rank with idle cores loads that much faster.
void read_slices(const Layout& layout, Slices& slices, int rank, models::ParameterSource& source,
                 const std::set<std::pair<size_t, size_t>>& mapped) {
  struct Read {
    const std::string* name;
    std::pair<int64_t, int64_t> range;
    at::Tensor out;
  };
  std::vector<Read> reads;
  for (const std::string& name : source.order()) {
    const SlotRef ref = layout.find(name);
    const FlatGroup& g = layout.units[ref.unit].groups[ref.group];
    const Slot& slot = g.slots[ref.slot];
    if (!slot.param.is_meta() || mapped.count({ref.unit, ref.group})) continue;
    const auto range = g.owned_range(slot, rank);
    if (range.first == range.second) continue;
    GroupSlices& gs = slices.units[ref.unit][ref.group];
    reads.push_back({&name, range, slot_part(g.trainable ? gs.master : gs.compute, g, slot, rank, range)});
  }
  const size_t threads =
      source.concurrent_reads() ? std::max<size_t>(1, std::min<size_t>(at::get_num_threads(), reads.size())) : 1;
  source.stats.threads = static_cast<int>(threads);
  std::atomic<size_t> next{0};
  std::mutex failed;
  std::exception_ptr error;
  const auto work = [&] {
    for (size_t i = next++; i < reads.size(); i = next++) {
      try {
        source.read_into(*reads[i].name, reads[i].range.first, reads[i].range.second, reads[i].out);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failed);
        if (!error) error = std::current_exception();
        next = reads.size();  // the other threads stop after their current read
      }
    }
  };
  // On ATen's own pool: a std::thread of ours would start an OpenMP team of
  // its own at its first parallel op (a cast), threads beyond the rank's
  // share; inside ATen's parallel region those ops run inline.
  at::parallel_for(0, static_cast<int64_t>(threads), 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) work();
  });
  if (error) std::rethrow_exception(error);
}

// Zeros that cost nothing until used: a large CPU tensor is fresh anonymous
// memory, which the kernel hands out zeroed on first touch, so the AdamW
// moments and gradient accumulators of a full fine-tune (12 bytes per
// trainable parameter) are not written twice; their pages fault in at the
// first step that uses them. Small tensors and other devices: at::zeros.
at::Tensor untouched_zeros(int64_t numel, const at::TensorOptions& options) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType());
  constexpr size_t kMinBytes = size_t{1} << 20;
  if (!options.device().is_cpu() || bytes < kMinBytes) return at::zeros({numel}, options);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) return at::zeros({numel}, options);
  return at::from_blob(
      data, {numel}, [bytes](void* p) { ::munmap(p, bytes); }, options);
}

// This rank's part of a frozen group mapped from the source's file where it
// is one run of it (ParameterSource::map_ranges): every slot in the part is
// the source's to supply, and the part holds no padding (padding past the
// file's run would be other tensors' bytes, or past the end of the file).
at::Tensor map_frozen(const FlatGroup& g, int rank, c10::Device device, models::ParameterSource* source) {
  if (!source || g.trainable || !device.is_cpu() || (rank + 1) * g.shard > g.numel) return {};
  std::vector<models::ParameterSource::Range> ranges;
  for (const Slot& slot : g.slots) {
    const auto range = g.owned_range(slot, rank);
    if (range.first == range.second) continue;
    if (!slot.param.is_meta()) return {};
    ranges.push_back({&slot.name, range.first, range.second});
  }
  return source->map_ranges(ranges, g.compute);
}

// Points a parameter at `data`. A meta parameter (a sliced family's) cannot
// take CPU or CUDA data through set_data, whose check refuses a change of
// backend; both are plain TensorImpls, so its metadata (device, dispatch keys,
// storage) is replaced in place as set_data would, keeping the module's
// handles and the autograd metadata. It has never been used in autograd, so
// there is no gradient accumulator to reset.
void point_at(const at::Tensor& param, const at::Tensor& data) {
  if (param.is_meta())
    param.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  else
    param.set_data(data);
}

}  // namespace

Slices take_slices(const Layout& layout, int rank, c10::Device device, models::ParameterSource* source) {
  const auto start = Clock::now();
  std::set<std::string> supplied;
  if (source) supplied.insert(source->order().begin(), source->order().end());
  Slices slices;
  slices.device = device;
  std::set<std::pair<size_t, size_t>> mapped;  // (unit, group)
  for (size_t u = 0; u < layout.units.size(); ++u) {
    std::vector<GroupSlices>& groups = slices.units.emplace_back();
    for (size_t i = 0; i < layout.units[u].groups.size(); ++i) {
      const FlatGroup& g = layout.units[u].groups[i];
      GroupSlices& gs = groups.emplace_back();
      if (at::Tensor view = map_frozen(g, rank, device, source); view.defined()) {
        gs.compute = view;
        mapped.insert({u, i});
        continue;
      }
      const c10::ScalarType held = g.trainable ? g.master : g.compute;
      // Every element below the group's end is written below (a
      // materialised parameter's copy or a source's read), so only the
      // padding past it is zeroed: a zero-fill first would touch every page
      // once more (on the 2.3 GB of an SD3.5-medium rank it took longer
      // than reading the weights).
      at::Tensor values = at::empty({g.shard}, slices.on(held));
      const int64_t filled = std::clamp<int64_t>(g.numel - rank * g.shard, 0, g.shard);
      values.narrow(0, filled, g.shard - filled).zero_();
      for (const Slot& slot : g.slots) {
        if (slot.param.device().is_meta()) {
          if (!supplied.count(slot.name))
            fail("sharded parameters: '{}' is on the meta device and {}", slot.name,
                 source ? "its source (seeded init or weights) does not supply it" : "no source supplies its values");
          continue;
        }
        const auto range = g.owned_range(slot, rank);
        if (range.first == range.second) continue;
        slot_part(values, g, slot, rank, range)
            .copy_(slot.param.detach().reshape(-1).narrow(0, range.first, range.second - range.first));
      }
      if (g.trainable)
        gs.master = values;
      else
        gs.compute = values;
    }
  }
  if (source) {
    source->stats.allocate_s += seconds_since(start);
    const auto read = Clock::now();
    read_slices(layout, slices, rank, *source, mapped);
    dist::finish_host_copies(device);
    source->stats.read_s += seconds_since(read);
  }
  const auto state = Clock::now();
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (size_t i = 0; i < layout.units[u].groups.size(); ++i) {
      const FlatGroup& g = layout.units[u].groups[i];
      GroupSlices& gs = slices.units[u][i];
      if (g.trainable) {
        gs.exp_avg = untouched_zeros(g.shard, slices.on(at::kFloat));
        gs.exp_avg_sq = untouched_zeros(g.shard, slices.on(at::kFloat));
        gs.grad = untouched_zeros(g.shard, slices.on(at::kFloat));
        gs.compute = g.compute == g.master ? gs.master : gs.master.to(g.compute);
      }
      for (const Slot& slot : g.slots) point_at(slot.param, placeholder(g.compute, device));
    }
  if (source) source->stats.state_s += seconds_since(state);
  return slices;
}

}  // namespace ditrl::shard
