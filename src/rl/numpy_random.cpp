#include <ditrl/error.hpp>
#include <ditrl/rl/numpy_random.hpp>

#include <array>
#include <limits>
#include <vector>

namespace ditrl::rl {

namespace {

// numpy/random/bit_generator.pyx SeedSequence constants.
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// SeedSequence(seed).generate_state(4, uint64) as four 64-bit words.
std::array<uint64_t, 4> seed_sequence_state(uint64_t seed) {
  std::vector<uint32_t> entropy;  // the integer's 32-bit words, least significant first
  do {
    entropy.push_back(static_cast<uint32_t>(seed & 0xFFFFFFFFu));
    seed >>= 32;
  } while (seed > 0);

  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));

  std::array<uint32_t, 8> words{};
  uint32_t out_const = kInitB;
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= out_const;
    out_const *= kMultB;
    v *= out_const;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::array<uint64_t, 4> state{};
  for (size_t i = 0; i < 4; ++i) state[i] = uint64_t{words[2 * i]} | (uint64_t{words[2 * i + 1]} << 32);
  return state;
}

constexpr unsigned __int128 kMultiplier =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;

unsigned __int128 make128(uint64_t high, uint64_t low) {
  return (static_cast<unsigned __int128>(high) << 64) | low;
}

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  const auto words = seed_sequence_state(seed);
  // pcg_setseq_128_srandom_r(seed = words[0:2], sequence = words[2:4]), high word first.
  increment_ = (make128(words[2], words[3]) << 1) | 1u;
  state_ = 0;
  step();
  state_ += make128(words[0], words[1]);
  step();
}

void NumpyGenerator::step() {
  state_ = state_ * kMultiplier + increment_;
}

uint64_t NumpyGenerator::next_uint64() {
  step();
  const auto rotation = static_cast<unsigned>(state_ >> 122);
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  return (x >> rotation) | (x << ((64 - rotation) & 63));
}

uint32_t NumpyGenerator::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return buffered_uint32_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  buffered_uint32_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xFFFFFFFFu);
}

int64_t NumpyGenerator::integers(int64_t low, int64_t high) {
  if (high <= low) fail("integers: high ({}) must be greater than low ({})", high, low);
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low) - 1;  // inclusive span
  if (range == 0) return low;
  if (range >= std::numeric_limits<uint32_t>::max())
    fail("integers: spans of 2^32 values or more are not supported, got [{}, {})", low, high);
  const auto rng = static_cast<uint32_t>(range);
  const uint32_t rng_excl = rng + 1;
  uint64_t m = uint64_t{next_uint32()} * rng_excl;
  auto leftover = static_cast<uint32_t>(m & 0xFFFFFFFFu);
  if (leftover < rng_excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = uint64_t{next_uint32()} * rng_excl;
      leftover = static_cast<uint32_t>(m & 0xFFFFFFFFu);
    }
  }
  return low + static_cast<int64_t>(m >> 32);
}

}  // namespace ditrl::rl
