// SHA-256 throughput of io::Sha256, the hash every checkpoint byte goes
// through when it is written and when it is loaded (io/hashed_write.cpp feeds
// it 8 MiB pieces). Hashes the same pseudo-random buffer `--repeats` times in
// `--piece-kib` pieces and prints one line:
//   <best GB/s> <median GB/s> <best GB/CPU-s> <median GB/CPU-s> <digest>
// over wall time and over the thread's CPU time (on a shared machine the
// latter leaves out the time other jobs hold the core). The digest lets two
// builds' binaries be compared on the same bytes: benchmarks/profile/sha256.sh
// runs them alternately.
//
//   bench_sha256 [--mib 1024] [--repeats 5] [--piece-kib 8192]

#include <ditrl/io/sha256.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

namespace {

// splitmix64 bytes: the same message in every build.
std::vector<unsigned char> message(size_t bytes) {
  std::vector<unsigned char> out(bytes);
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    for (size_t b = 0; b < 8 && i + b < bytes; ++b) out[i + b] = static_cast<unsigned char>(z >> (8 * b));
  }
  return out;
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Pass {
  double gb_per_s = 0, gb_per_cpu_s = 0;
  std::string digest;
};

Pass hash_once(const std::vector<unsigned char>& data, size_t piece) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  ditrl::io::Sha256 hash;
  for (size_t at = 0; at < data.size(); at += piece) hash.update(data.data() + at, std::min(piece, data.size() - at));
  Pass pass;
  pass.digest = hash.hex();
  const double cpu_seconds = thread_cpu_seconds() - cpu_start;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gb = static_cast<double>(data.size()) / 1e9;
  pass.gb_per_s = gb / seconds;
  pass.gb_per_cpu_s = gb / cpu_seconds;
  return pass;
}

// "<best> <median>" of the rates.
std::string best_and_median(std::vector<double> rates) {
  std::sort(rates.begin(), rates.end());
  return fmt::format("{:.3f} {:.3f}", rates.back(), rates[rates.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"SHA-256 throughput of io::Sha256 (the checkpoint hash)"};
  int mib = 1024, repeats = 5, piece_kib = 8192;
  app.add_option("--mib", mib, "message size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "passes over the message")->check(CLI::PositiveNumber);
  app.add_option("--piece-kib", piece_kib, "bytes per update() call, KiB")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const std::vector<unsigned char> data = message(static_cast<size_t>(mib) << 20);
  std::vector<double> rates, cpu_rates;
  std::string digest;
  for (int r = 0; r < repeats; ++r) {
    const Pass pass = hash_once(data, static_cast<size_t>(piece_kib) << 10);
    if (r > 0 && pass.digest != digest) {
      std::fprintf(stderr, "bench_sha256: pass %d gave another digest\n", r);
      return 1;
    }
    digest = pass.digest;
    rates.push_back(pass.gb_per_s);
    cpu_rates.push_back(pass.gb_per_cpu_s);
  }
  fmt::print("{} {} {}\n", best_and_median(rates), best_and_median(cpu_rates), digest);
  return 0;
}
