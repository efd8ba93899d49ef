#pragma once

// SHA-256 (FIPS 180-4) of files, for provenance attributes users compare with
// `sha256sum` (which encoder produced a prompt dataset, which prompts), and
// checkpoint integrity. Uses the x86 SHA extensions where the CPU has them.

#include <cstddef>
#include <string>

namespace ditrl::io {

// Lower-case hex digest of the file's bytes (error naming the file if it cannot be read).
std::string sha256_file(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string sha256(const std::string& bytes);
std::string sha256(const void* data, size_t size);

}  // namespace ditrl::io
