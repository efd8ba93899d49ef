#pragma once

// SHA-256 (FIPS 180-4) of files, for provenance attributes users compare with
// `sha256sum` (which encoder produced a prompt dataset, which prompts), and
// checkpoint integrity. Uses the x86 SHA extensions where the CPU has them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ditrl::io {

// Incremental SHA-256: update() with consecutive pieces of a message, then
// hex() once; the same digest as sha256() of the concatenation.
class Sha256 {
 public:
  void update(const void* data, size_t size);
  std::string hex();

 private:
  void compress(const unsigned char* blocks, size_t count);
  void compress_portable(const unsigned char* block);

  std::array<uint32_t, 8> state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  size_t filled_ = 0;
  uint64_t bits_ = 0;
};

// Lower-case hex digest of the file's bytes (error naming the file if it cannot be read).
std::string sha256_file(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string sha256(const std::string& bytes);
std::string sha256(const void* data, size_t size);

}  // namespace ditrl::io
