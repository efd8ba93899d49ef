#pragma once

// Full model weights as diffusers and transformers save them: one
// `<stem>.safetensors` up to a size limit, above it shards
// `<stem>-00001-of-0000N.safetensors` and `<stem>.safetensors.index.json`
// ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}}), so
// `from_pretrained` and io::Checkpoint read either form. Tensors are split
// in the given order; one larger than the limit gets a shard of its own.

#include <ditrl/io/safetensors.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ditrl::io {

// diffusers' default max_shard_size ("10GB").
constexpr uint64_t kDefaultMaxShardBytes = 10'000'000'000ULL;

// "10GB", "500MB", "2GiB", "123456" (bytes); decimal units as
// huggingface_hub reads them, binary ones with "iB". Errors name `what`.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

// Writes the shards (each atomically), then the index; files of an earlier
// export under the same stem that the new set does not use are removed, so
// the folder never mixes two exports. Returns the paths written.
std::vector<std::string> write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                                   const NamedTensors& tensors, uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata = {});
// The same files with the tensors produced one at a time
// (write_safetensors_streamed): shards are split from the specs' sizes, and
// `values` is asked for each spec in the specs' order, so the writer holds
// one tensor at a time.
std::vector<std::string> write_sharded_safetensors_streamed(const std::string& dir, const std::string& stem,
                                                            const std::vector<TensorSpec>& specs,
                                                            const TensorValues& values, uint64_t max_shard_bytes,
                                                            const std::map<std::string, std::string>& metadata = {});

}  // namespace ditrl::io
