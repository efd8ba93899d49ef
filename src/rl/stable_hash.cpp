#include <ditrl/error.hpp>
#include <ditrl/rl/stable_hash.hpp>

#include <array>
#include <cstring>

namespace ditrl::rl {

namespace {

constexpr std::array<uint64_t, 8> kIv = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                                         0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                         0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

constexpr uint8_t kSigma[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0}};

uint64_t rotr(uint64_t x, int n) {
  return (x >> n) | (x << (64 - n));
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void mix(std::array<uint64_t, 16>& v, int a, int b, int c, int d, uint64_t x, uint64_t y) {
  v[a] = v[a] + v[b] + x;
  v[d] = rotr(v[d] ^ v[a], 32);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 24);
  v[a] = v[a] + v[b] + y;
  v[d] = rotr(v[d] ^ v[a], 16);
  v[c] = v[c] + v[d];
  v[b] = rotr(v[b] ^ v[c], 63);
}

// RFC 7693 §3.2 F: one 128-byte block; `bytes` counts every input byte so far.
void compress(std::array<uint64_t, 8>& h, const uint8_t* block, uint64_t bytes, bool last) {
  std::array<uint64_t, 16> m{};
  for (int i = 0; i < 16; ++i) m[i] = load_le64(block + 8 * i);
  std::array<uint64_t, 16> v{};
  for (int i = 0; i < 8; ++i) {
    v[i] = h[i];
    v[i + 8] = kIv[i];
  }
  v[12] ^= bytes;  // the high word of the 128-bit counter stays 0 below 2^64 bytes
  if (last) v[14] = ~v[14];
  for (int round = 0; round < 12; ++round) {
    const uint8_t* s = kSigma[round % 10];
    mix(v, 0, 4, 8, 12, m[s[0]], m[s[1]]);
    mix(v, 1, 5, 9, 13, m[s[2]], m[s[3]]);
    mix(v, 2, 6, 10, 14, m[s[4]], m[s[5]]);
    mix(v, 3, 7, 11, 15, m[s[6]], m[s[7]]);
    mix(v, 0, 5, 10, 15, m[s[8]], m[s[9]]);
    mix(v, 1, 6, 11, 12, m[s[10]], m[s[11]]);
    mix(v, 2, 7, 8, 13, m[s[12]], m[s[13]]);
    mix(v, 3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

}  // namespace

std::vector<uint8_t> blake2b(const void* data, size_t size, size_t digest_size) {
  if (digest_size < 1 || digest_size > 64) fail("blake2b: digest size must be 1..64 bytes, got {}", digest_size);
  std::array<uint64_t, 8> h = kIv;
  h[0] ^= 0x01010000ULL ^ digest_size;  // parameter block: fanout 1, depth 1, no key
  const auto* in = static_cast<const uint8_t*>(data);
  size_t offset = 0;
  while (size - offset > 128) {  // every full block but the last
    compress(h, in + offset, offset + 128, false);
    offset += 128;
  }
  uint8_t last[128] = {};
  if (size > offset) std::memcpy(last, in + offset, size - offset);
  compress(h, last, size, true);
  std::vector<uint8_t> out(digest_size);
  for (size_t i = 0; i < digest_size; ++i) out[i] = static_cast<uint8_t>(h[i / 8] >> (8 * (i % 8)));
  return out;
}

uint64_t stable_hash_of(const std::vector<std::string>& parts) {
  std::string payload;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) payload += ':';
    payload += parts[i];
  }
  const std::vector<uint8_t> digest = blake2b(payload.data(), payload.size(), 8);
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | digest[static_cast<size_t>(i)];
  return value & ((uint64_t{1} << 63) - 1);
}

}  // namespace ditrl::rl
