#pragma once

// SHA-256 (FIPS 180-4) of files, for provenance attributes users compare with
// `sha256sum` (which encoder produced a prompt dataset, which prompts).

#include <string>

namespace ditrl::io {

// Lower-case hex digest of the file's bytes (error naming the file if it cannot be read).
std::string sha256_file(const std::string& path);

// Lower-case hex digest of `bytes`.
std::string sha256(const std::string& bytes);

}  // namespace ditrl::io
