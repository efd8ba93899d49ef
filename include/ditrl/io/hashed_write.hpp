#pragma once

// Writing many byte ranges of one existing file (a checkpoint's slabs) at
// disk speed, with the SHA-256 of each range computed on the way.
//
// The 4 KiB-aligned interior of every range goes through O_DIRECT from a
// reused aligned staging buffer: the page cache is bypassed, so a
// multi-gigabyte checkpoint neither pays for allocating gigabytes of cache
// pages (on VMs whose free memory is handed back to the host, that costs more
// than the disk) nor evicts what the run keeps cached. The unaligned edges,
// which neighbouring writers may share, are written through the page cache.
// Where the file system refuses O_DIRECT, everything is written buffered,
// and the result says so (how many bytes went each way, and why O_DIRECT
// was given up), so a caller or a test can tell. Nothing is synced: the caller fsyncs the file before publishing it.
//
// Ranges in GPU memory (HashedWriteOptions::source on CUDA) are staged
// device -> host chunk by chunk into each worker's pinned, 4 KiB-aligned
// buffer and hashed and written from there; with two or more workers one
// copies while another hashes and writes.

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ditrl::io {

// O_DIRECT's alignment of file offset, length and memory: 4 KiB satisfies
// 512-byte and 4 KiB block devices and page-granular parallel file systems.
// A range's bytes from the first multiple of it on go out directly.
constexpr int64_t kDirectAlignment = 4096;

// `size` bytes at `data`, for file offset `offset`.
struct ByteRange {
  int64_t offset = 0;
  const void* data = nullptr;
  int64_t size = 0;
};

struct HashedWriteOptions {
  int threads = 2;                 // workers; each copies, hashes and writes whole ranges
  bool direct = true;              // false: buffered writes only
  c10::Device source = c10::kCPU;  // where every range's bytes are
};

struct HashedWriteResult {
  std::vector<std::string> digests;  // SHA-256 (lower-case hex) of each range, in the order of `ranges`
  int64_t direct_bytes = 0;          // written through O_DIRECT
  int64_t buffered_bytes = 0;        // written through the page cache
  // Empty, or why O_DIRECT was given up: the open or the write that the
  // file system refused, with its errno.
  std::string direct_refused;
};

// Writes every range into `path`. Errors name the file, offset and size.
HashedWriteResult write_hashed(const std::string& path, const std::vector<ByteRange>& ranges,
                                      const HashedWriteOptions& options = {});

}  // namespace ditrl::io
