#pragma once

// numpy.random.default_rng(seed) reproduced bit for bit: SeedSequence entropy
// mixing, the PCG64 bit generator (XSL-RR 128/64) and Generator.integers'
// bounded draws (Lemire's method on 32-bit outputs). The sde_window step
// strategy of the reference draws its window start with it, so the same seed
// picks the same window here.

#include <cstdint>

namespace ditrl::rl {

class NumpyGenerator {
 public:
  explicit NumpyGenerator(uint64_t seed);  // default_rng(seed) for a non-negative integer seed

  uint64_t next_uint64();
  uint32_t next_uint32();  // half of a 64-bit output, low half first (as PCG64 buffers it)
  // Generator.integers(low, high): uniform int64 in [low, high); high - low - 1 must fit in 32 bits.
  int64_t integers(int64_t low, int64_t high);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 increment_ = 0;
  bool has_uint32_ = false;
  uint32_t buffered_uint32_ = 0;

  void step();
};

}  // namespace ditrl::rl
