#include <ditrl/error.hpp>
#include <ditrl/io/file_descriptor.hpp>
#include <ditrl/io/hashed_write.hpp>
#include <ditrl/io/sha256.hpp>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

namespace ditrl::io {

namespace {

// Smaller ranges go through the page cache: an O_DIRECT write waits for the
// device, which costs more than copying a few hundred KiB into the cache.
constexpr int64_t kDirectMinimum = int64_t{1} << 20;
// One staging buffer per worker: large enough for few system calls, small
// enough to stay in cache between the copy, the hash and the write.
constexpr int64_t kStage = int64_t{8} << 20;

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

class Target {
 public:
  Target(const std::string& path, bool direct)
      : path_(path),
        buffered_(::open(path.c_str(), O_WRONLY)),
        direct_(direct ? ::open(path.c_str(), O_WRONLY | O_DIRECT) : -1) {
    if (direct && direct_.get() < 0) refuse(fmt::format("open with O_DIRECT: {}", std::strerror(errno)));
    if (buffered_.get() < 0) fail("{}: cannot open for writing: {}", path, std::strerror(errno));
    direct_ok_ = direct_.get() >= 0;
  }

  bool direct_ok() const { return direct_ok_; }
  int64_t direct_bytes() const { return direct_bytes_; }
  int64_t buffered_bytes() const { return buffered_bytes_; }
  // A write that failed (errno read before anything can overwrite it).
  [[noreturn]] void write_failed(int64_t size, int64_t offset) const {
    const int error = errno;
    fail_write(error, fmt::format("{}: writing {} bytes at offset {} failed", path_, size, offset));
  }

  std::string refused() {
    std::lock_guard<std::mutex> lock(refused_mutex_);
    return refused_;
  }

  void write_buffered(const char* data, int64_t size, int64_t offset) {
    while (size > 0) {
      const ssize_t n = ::pwrite(buffered_.get(), data, static_cast<size_t>(size), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) write_failed(size, offset);
      buffered_bytes_ += n;
      data += n, size -= n, offset += n;
    }
  }

  // Aligned data, offset and size. What O_DIRECT does not take (the file
  // system refuses it, or a short write leaves an unaligned rest) is written
  // buffered.
  void write_direct(const char* data, int64_t size, int64_t offset) {
    while (size > 0 && direct_ok_) {
      const ssize_t n = ::pwrite(direct_.get(), data, static_cast<size_t>(size), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
        refuse(fmt::format("O_DIRECT write of {} bytes at offset {}: {}", size, offset, std::strerror(errno)));
        direct_ok_ = false;
        break;
      }
      if (n <= 0) write_failed(size, offset);
      direct_bytes_ += n;
      data += n, size -= n, offset += n;
      if (n % kDirectAlignment != 0) break;
    }
    write_buffered(data, size, offset);
  }

 private:
  void refuse(const std::string& why) {
    std::lock_guard<std::mutex> lock(refused_mutex_);
    if (refused_.empty()) refused_ = why;
  }

  std::string path_;
  FileDescriptor buffered_;
  FileDescriptor direct_;
  std::atomic<bool> direct_ok_{false};
  std::atomic<int64_t> direct_bytes_{0};
  std::atomic<int64_t> buffered_bytes_{0};
  std::mutex refused_mutex_;
  std::string refused_;
};

// A worker's staging buffer: aligned host memory for host ranges; pinned
// memory, filled by a device -> host copy, for ranges in GPU memory.
class Stage {
 public:
  explicit Stage(const std::string& path, c10::Device source) : source_(source) {
    if (source.is_cpu()) {
      host_.reset(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kStage)));
      if (!host_) fail("{}: cannot allocate a {}-byte staging buffer", path, kStage);
      data_ = host_.get();
    } else {
      pinned_ = at::empty({kStage}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      data_ = static_cast<char*>(pinned_.data_ptr());
      if (reinterpret_cast<uintptr_t>(data_) % kDirectAlignment != 0)
        fail("{}: the pinned staging buffer is not {}-byte aligned", path, kDirectAlignment);
    }
  }
  bool host_source() const { return source_.is_cpu(); }
  // The n <= kStage bytes at `src`, in the stage.
  const char* fill(const char* src, int64_t n) {
    if (host_source()) {
      std::memcpy(data_, src, static_cast<size_t>(n));
    } else {
      const at::Tensor from =
          at::from_blob(const_cast<char*>(src), {n}, at::TensorOptions().dtype(at::kByte).device(source_));
      pinned_.narrow(0, 0, n).copy_(from);
    }
    return data_;
  }

 private:
  c10::Device source_;
  std::unique_ptr<char, AlignedFree> host_;
  at::Tensor pinned_;
  char* data_ = nullptr;
};

// Copies, hashes and writes one range: the hash reads the staged bytes while
// they are in cache, and is of exactly what was written. Host bytes outside
// the direct interior are hashed and written where they are.
std::string write_range(const ByteRange& range, Target& target, Stage& stage) {
  Sha256 hash;
  const char* data = static_cast<const char*>(range.data);
  int64_t offset = range.offset, left = range.size;
  auto buffered = [&](int64_t n) {
    for (int64_t done = 0; done < n;) {
      const int64_t piece = std::min(kStage, n - done);
      const char* bytes = stage.host_source() ? data + done : stage.fill(data + done, piece);
      hash.update(bytes, static_cast<size_t>(piece));
      target.write_buffered(bytes, piece, offset + done);
      done += piece;
    }
    data += n, offset += n, left -= n;
  };
  if (target.direct_ok() && range.size >= kDirectMinimum) {
    buffered(std::min(left, (kDirectAlignment - offset % kDirectAlignment) % kDirectAlignment));
    while (left >= kDirectAlignment && target.direct_ok()) {
      const int64_t n = std::min(kStage, left / kDirectAlignment * kDirectAlignment);
      const char* bytes = stage.fill(data, n);
      hash.update(bytes, static_cast<size_t>(n));
      target.write_direct(bytes, n, offset);
      data += n, offset += n, left -= n;
    }
  }
  buffered(left);
  return hash.hex();
}

}  // namespace

HashedWriteResult write_hashed(const std::string& path, const std::vector<ByteRange>& ranges,
                               const HashedWriteOptions& options) {
  Target target(path, options.direct);
  // In file order: the workers' writes advance through the file together.
  std::vector<size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a].offset < ranges[b].offset; });

  std::vector<std::string> digests(ranges.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      Stage stage(path, options.source);
      for (size_t i = next++; i < order.size() && !failed; i = next++)
        digests[order[i]] = write_range(ranges[order[i]], target, stage);
    } catch (...) {
      failed = true;
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < std::max(1, options.threads); ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  if (error) std::rethrow_exception(error);
  return {std::move(digests), target.direct_bytes(), target.buffered_bytes(), target.refused()};
}

}  // namespace ditrl::io
