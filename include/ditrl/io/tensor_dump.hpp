#pragma once

// Tensor dump files: named tensors of forward passes, for train/rollout
// parity checks (`ditrl align`). Layout, which other engines may write too:
//
//   /<side>/<key>/<module>/<tensor>    one dataset per recorded tensor
//     side    "rollout" | "train" (any name; align pairs a side of each file)
//     key     which forward, e.g. "r0_s3_t2" (rollout 0, sample 3, step 2)
//     module  checkpoint module path, e.g. "transformer_blocks.0.attn" (no '/')
//     tensor  "out0", "in0", "mean", ...
//   dataset attributes
//     seq     int64, optional: record order within the side (the forward
//             order `ditrl align` reports the first divergence along)
//     dtype   string, optional: "fp32" | "bf16" | "fp16" | ...
//
// Values keep their dtype. bf16 and fp16 are stored as HDF5 16-bit floats
// (bf16: 8 exponent, 7 mantissa bits) with dtype = "bf16"/"fp16"; a 16-bit
// integer dataset with dtype = "bf16" or "fp16" is read as those bits (how
// h5py, which has no bf16, can write them). ditrl writes one serial file per
// rank (OUT/debug/dump-rank<r>.h5) holding the rank's own samples.

#include <ditrl/io/h5.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::io {

class TensorDumpWriter {
 public:
  // Creates (truncates) `path`.
  explicit TensorDumpWriter(const std::string& path);
  // A tensor recorded twice under one key and module is stored as
  // "<tensor>.call<k>" from its second record on.
  void write(const std::string& side, const std::string& key, const std::string& module, const std::string& tensor,
             const at::Tensor& value);
  void flush() { file_.flush(); }
  const std::string& path() const { return file_.file_name(); }

 private:
  h5::File file_;
  std::map<std::string, int64_t> next_seq_;  // per side
};

// One stored tensor, without its values.
struct DumpEntry {
  std::string key;
  std::string path;  // "<module>/<tensor>"
  int64_t seq = -1;  // -1: the writer stored no order
};

// Every tensor of `side`, in the file's link order; throws naming the file
// when the side is absent (listing the sides present) or a dataset sits at
// another depth than /<side>/<key>/<module>/<tensor>.
std::vector<DumpEntry> list_tensor_dump(const h5::File& file, const std::string& side);

// The stored values in their stored dtype.
at::Tensor read_dumped_tensor(const h5::File& file, const std::string& side, const DumpEntry& entry);

}  // namespace ditrl::io
