#pragma once

// safetensors checkpoints (docs/families.md §8): a little-endian u64 header length,
// a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}},
// then the raw tensor bytes. Files are memory-mapped (private, copy-on-write);
// a sharded checkpoint is a `*.index.json` whose weight_map names the shard
// holding each tensor. Every malformed or hostile file is an Error naming the
// file (and the tensor) and what was expected; nothing is read out of bounds.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ditrl::io {

// Header-declared size cap, as in the reference reader.
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype;           // safetensors code: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // [] = scalar
  uint64_t begin = 0;          // byte offsets relative to the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// The LibTorch dtype of a code; throws naming `what` when this LibTorch
// cannot hold it (sub-byte floats, unsigned 16/32/64 on 1.13, ...).
c10::ScalarType safetensors_scalar_type(const std::string& code, const std::string& what);

class MappedBytes;

// One safetensors file, validated on open.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Parses bytes already in memory; `source` names them in errors.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, const std::string& source);

  const std::string& path() const { return path_; }
  // Tensors in data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Where the data section starts in the file (tensor offsets are relative to it).
  uint64_t data_start() const { return data_start_; }

  // An owned CPU copy of the tensor.
  at::Tensor get(const std::string& name) const;
  // A CPU tensor over the mapping (kept alive by the tensor); writes stay in
  // this process. Falls back to a copy when the bytes are not aligned.
  at::Tensor view(const std::string& name) const;
  // Elements [begin, end) of the flattened tensor as an owned 1-D CPU tensor
  // of its stored dtype: only those bytes are read, and none of the file
  // stays resident (sliced loading reads a rank's part of every tensor).
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t end) const;
  // The same bytes read into `out`: a contiguous CPU tensor of the stored
  // dtype and end - begin elements (sliced loading reads straight into a
  // rank's slice).
  void read_range_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out) const;
  // view and read_range_into of a part of a tensor: `part` has the tensor's
  // name and dtype and a contiguous byte range within it (Checkpoint::regroup).
  at::Tensor view(const TensorInfo& part) const;
  void read_range_into(const TensorInfo& part, int64_t begin, int64_t end, const at::Tensor& out) const;

 private:
  SafetensorsFile(std::shared_ptr<const MappedBytes> bytes, std::string path);

  std::string path_;
  std::shared_ptr<const MappedBytes> bytes_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Rows [begin, end) (along dim 0) of a stored tensor.
struct StoredRows {
  std::string stored;
  int64_t begin = 0, end = 0;
};

// A checkpoint: one safetensors file, or a `*.safetensors.index.json` and its
// shards (resolved next to the index). Names are unique across shards.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);

  // Presents each entry of `tensors` as the concatenation, along dim 0, of
  // its rows of stored tensors, in place of those stored tensors (which
  // leave names()): a layout that fuses parameters into one tensor (Black
  // Forest Labs' q, k and v) or orders their rows otherwise (a modulation's
  // (shift, scale) halves) is read under the model's names, with no copy.
  // Every row of a source goes to exactly one presented tensor, and the
  // sources of one tensor share its dtype and sizes after dim 0; otherwise an
  // Error names the file and the tensors. Once per checkpoint.
  void regroup(const std::map<std::string, std::vector<StoredRows>>& tensors);
  // How many stored tensors regroup() replaced.
  size_t regrouped() const { return hidden_.size(); }

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  at::Tensor get(const std::string& name) const;
  at::Tensor view(const std::string& name) const;                                    // see SafetensorsFile::view
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t end) const;  // see SafetensorsFile
  void read_range_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out) const;
  // The file that holds `name` (the shard for an index), and where its bytes
  // start in that file; nullopt for a regrouped tensor gathered from several
  // runs of bytes.
  const std::string& file_of(const std::string& name) const;
  std::optional<uint64_t> file_offset(const std::string& name) const;
  // The single file's metadata, or the index's "metadata" values as text.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  const SafetensorsFile& shard(const std::string& name) const;

  // A regrouped tensor: its info (begin/end locate it only when it is one
  // run), and its runs of bytes in order.
  struct Piece {
    size_t file = 0;
    TensorInfo part;  // the stored tensor's name and dtype, the run's bytes
  };
  struct Presented {
    TensorInfo info;
    std::vector<Piece> pieces;
  };
  const Presented* presented(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> shard_of_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Presented> presented_;
  std::set<std::string> hidden_;  // stored tensors regroup() replaced
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Bytes [offset, offset + bytes) of the file at `path` as a 1-D CPU tensor of
// `dtype` over a private (copy-on-write) mapping, its pages mapped from the
// page cache now (MADV_POPULATE_READ where the kernel has it): no copy, and
// the memory stays the page cache's until written. `offset` is a multiple of
// the dtype's size; the mapping lives as long as the tensor's storage. An
// undefined tensor where the file system cannot map the file.
at::Tensor map_private(const std::string& path, uint64_t offset, uint64_t bytes, c10::ScalarType dtype);

// Writes tensors (any device; copied to CPU, made contiguous) to `path`
// atomically: data sorted by dtype alignment (descending) then name, header
// padded with spaces to a multiple of 8, `metadata` as "__metadata__".
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// A tensor whose values are produced while its file is written
// (write_safetensors_streamed): name, stored dtype and shape are all the
// header needs.
struct TensorSpec {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};
// The values of one spec, asked for once per spec in the specs' order: any
// CPU tensor of its numel, cast to spec.dtype on the way to the file.
using TensorValues = std::function<at::Tensor(const TensorSpec&)>;

// write_safetensors with the tensors produced one at a time: the same header
// and layout (same bytes), each tensor written at its offset as soon as it
// is produced and then dropped, so a writer holds one tensor at a time, not
// the file's contents. Atomic; a failure removes the partial file.
void write_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& specs,
                                const TensorValues& values, const std::map<std::string, std::string>& metadata = {});
// The bytes write_safetensors would write.
std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata = {});

}  // namespace ditrl::io
