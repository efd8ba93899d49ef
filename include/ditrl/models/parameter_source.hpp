#pragma once

// Where the values of a sliced family's parameters come from
// (FamilyOptions::sliced: parameters on the meta device). The sharded-
// parameter manager asks for each rank's element range of each parameter, in
// the order order() lists them, and casts what it gets into the slice's dtype
// (shard::take_slices). A source gives bitwise the values the unsliced path
// holds in its fp32 parameters, so both paths build the same slices: the
// seeded init (init_parameters), or a checkpoint's tensors cast to fp32
// (load_weights).

#include <ditrl/io/safetensors.hpp>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

// What loading this rank's slices cost, by phase (the rank log's [load]
// line): the source counts its reads and casts, shard::take_slices the rest.
struct LoadStats {
  double allocate_s = 0;      // slices allocated or mapped, their padding zeroed, materialised parameters copied in
  double read_s = 0;          // wall time of the reads into the slices (pread, or the seeded draws), copies included
  double copy_s = 0;          // of which copies into the slices' dtype and device (summed over reading threads)
  double state_s = 0;         // AdamW moments and gradient accumulators zeroed, compute copies of trainable masters
  uint64_t bytes = 0;         // from files (the seeded init reads none), mapped ones included
  uint64_t mapped_bytes = 0;  // of which mapped from the files instead of read (map_ranges)
  int threads = 1;            // threads that read
};

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  // The parameters it supplies, in the order read() must be asked for them.
  virtual const std::vector<std::string>& order() const = 0;
  // Elements [begin, end) of `name`'s flattened value: a 1-D CPU tensor in
  // fp32 or in a dtype whose every value fp32 holds exactly (a bf16 or fp16
  // checkpoint's own), so that one cast into the slice's dtype rounds as the
  // fp32 parameter's cast would.
  virtual at::Tensor read(const std::string& name, int64_t begin, int64_t end) = 0;
  // The same elements written into `out` (end - begin elements, any dtype
  // and device), cast as out.copy_(read(...)) would; a source may read
  // straight into `out` where no cast is needed. Counts into `stats`.
  virtual void read_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out);
  // Whether read_into may run on several threads at once, in any order
  // (a checkpoint's preads; not the seeded init, whose draws are sequential).
  virtual bool concurrent_reads() const { return false; }
  // Consecutive element ranges of parameters (a rank's part of a frozen flat
  // group, in the group's order) as one 1-D CPU tensor of `dtype` over a
  // private mapping of the file that stores exactly those elements back to
  // back: no copy, and the pages stay the page cache's until written. An
  // undefined tensor where they are not one run of one file in `dtype` (the
  // caller reads them instead). Counts into `stats`.
  struct Range {
    const std::string* name;  // canonical (shard::Slot::name)
    int64_t begin = 0, end = 0;
  };
  virtual at::Tensor map_ranges(const std::vector<Range>& /*ranges*/, c10::ScalarType /*dtype*/) { return {}; }

  LoadStats stats;
};

// Elements [begin, end) of `name` in `file` written into `out` (end - begin
// elements of any dtype, on any device), as out.copy_(the stored values)
// would (fp64 through fp32, as read() rounds it). The bytes pass through host
// buffers of at most `chunk_bytes`: where `out` is on a GPU these are pinned
// blocks of LibTorch's caching host allocator, so each chunk's copy to the
// device is queued on the current stream while the next chunk is read, and a
// block is handed out again only once its copy has run; on the CPU one
// buffer is reused for every chunk of the call. The caller synchronises the
// device before the values are used on another stream. Returns the seconds
// spent in the copies (casts; on a GPU, queueing them).
inline constexpr size_t kStagingChunkBytes = size_t{16} << 20;
double stage_range_into(const io::Checkpoint& file, const std::string& name, int64_t begin, int64_t end,
                        const at::Tensor& out, size_t chunk_bytes = kStagingChunkBytes);

// init_parameters(model, seed) one parameter at a time: every value depends
// on all earlier draws of the one generator, so each rank draws the whole
// sequence, holding one full parameter at a time (the largest one is the
// peak). Supplies the model's meta parameters except the LoRA adapters
// (materialised and drawn by attach_lora).
std::unique_ptr<ParameterSource> seeded_source(const torch::nn::Module& model, int64_t seed);

// A checkpoint for a part of the model: `module` is the family itself, or a
// submodule that holds one checkpoint (Family::expert_modules: Wan2.2 A14B's
// two experts), whose parameter names are the checkpoint's names.
struct CheckpointPart {
  std::shared_ptr<torch::nn::Module> module;
  std::string path;
};

// The model's meta parameters read slice by slice from checkpoints (single
// safetensors files or `*.index.json` with shards). Every part is validated
// first (validate_checkpoint: missing, unexpected, wrongly-shaped and
// wrongly-typed tensors in one error naming the file), before any value is
// read; materialised tensors a checkpoint carries (SD3's pos_embed buffer,
// LoRA factors) are copied in whole, as load_weights does, except a windowed
// pos_embed (FamilyOptions::crop_to_grid), of which only the window's rows
// are read, here. `model` is the family whose parameter names order() lists.
std::unique_ptr<ParameterSource> checkpoint_source(torch::nn::Module& model, const std::vector<CheckpointPart>& parts);

}  // namespace ditrl::models
