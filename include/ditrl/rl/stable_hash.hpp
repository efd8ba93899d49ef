#pragma once

// stable_hash(parts...) of miles (docs/algorithms.md §4.1): the BLAKE2b digest
// (RFC 7693) of size 8 of ":".join(str(part)), read as a little-endian integer
// and masked to 63 bits. Seeds every trainer-side random draw (NFT shuffles
// and corruption noise, SFT grids) so runs and ranks reproduce; integers and
// strings format as Python's str() does.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace ditrl::rl {

// BLAKE2b, unkeyed, digest_size in [1, 64] bytes.
std::vector<uint8_t> blake2b(const void* data, size_t size, size_t digest_size);

uint64_t stable_hash_of(const std::vector<std::string>& parts);

namespace detail {
inline std::string hash_part(const std::string& s) {
  return s;
}
inline std::string hash_part(const char* s) {
  return s;
}
template <class Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
std::string hash_part(Int value) {
  return std::to_string(value);
}
}  // namespace detail

template <class... Parts>
uint64_t stable_hash(const Parts&... parts) {
  return stable_hash_of({detail::hash_part(parts)...});
}

}  // namespace ditrl::rl
