// Checkpoint write bandwidth against a plain sequential write of the same
// bytes on the same disk, in the same run.
//
// Builds the deck's model sharded over the launch's ranks (as `ditrl train`
// does), writes one untimed checkpoint, then alternates, `repeats` times (in
// reversed order on odd repeats, each timed write after a settle pause):
//   checkpoint: io::save_checkpoint (every rank its slab, tmp -> fsync ->
//               rename -> latest), timed on rank 0 from a barrier to the return
//   plain:      rank 0 write()s the bytes of the warm-up checkpoint file (read
//               into memory once) to a file in the same directory in 4 MiB
//               blocks, then fsync()s
// and prints one markdown row with the medians, their ratio (plain seconds /
// checkpoint seconds = checkpoint bandwidth / plain bandwidth), the median of
// the per-repeat ratios, and the time to delete the previous checkpoint
// (outside both timings, as removing plain.bin is).
//
//   mpiexec -n N bench_checkpoint DECK OUT_DIR LABEL [repeats] [k=v override ...]

#include <ditrl/app/run.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace ditrl;
namespace fs = std::filesystem;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The bytes of `path` (the warm-up checkpoint): the plain write sends the
// very bytes a checkpoint holds, from memory as a writer would, not one
// cache-resident block over and over.
std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes(static_cast<size_t>(fs::file_size(path)));
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    fail("bench_checkpoint: cannot read {}", path);
  return bytes;
}

double plain_write(const std::string& path, const std::vector<char>& bytes) {
  constexpr size_t kBlock = 4 << 20;
  const double start = now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("bench_checkpoint: cannot create {}", path);
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, std::min(kBlock, bytes.size() - done));
    if (n <= 0) fail("bench_checkpoint: write to {} failed", path);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("bench_checkpoint: fsync of {} failed", path);
  ::close(fd);
  const double seconds = now() - start;
  fs::remove(path);
  return seconds;
}

// Each timed write starts on an idle disk: this VM's disk absorbs a burst of
// about a gigabyte fast and then slows down ~4x, so a write that follows
// another within seconds measures the previous one's writeback.
constexpr unsigned kSettleSeconds = 5;

void settle() {
  MPI_Barrier(MPI_COMM_WORLD);
  ::sync();
  ::sleep(kSettleSeconds);
  MPI_Barrier(MPI_COMM_WORLD);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

int run(int argc, char** argv, const dist::MpiRuntime& mpi) {
  if (argc < 4) fail("usage: bench_checkpoint DECK OUT_DIR LABEL [repeats] [k=v ...]");
  const std::string out_dir = argv[2], label = argv[3];
  const int repeats = argc > 4 ? std::stoi(argv[4]) : 3;
  std::vector<std::string> overrides{"run.out_dir=" + out_dir, "run.deterministic=false"};
  for (int i = 5; i < argc; ++i) overrides.emplace_back(argv[i]);
  app::Run run = app::open_run(config::load_deck(argv[1], overrides), mpi);
  at::set_num_threads(mpi.default_threads());  // as `ditrl train` outside deterministic mode
  const bool root = mpi.world().rank == 0;
  if (root) fs::remove_all(fs::path(out_dir) / "checkpoints");

  // Untimed warm-up: the first checkpoint also pays first-touch page faults
  // and HDF5/MPI-IO start-up, which a training run pays once.
  MPI_Barrier(MPI_COMM_WORLD);
  const double first_start = now();
  std::string previous =
      io::save_checkpoint(out_dir, *run.params, {0, 0, mpi.world().size, 0, 0, run.deck_text}, {}, 1, MPI_COMM_WORLD);
  const double first_s = now() - first_start;
  const std::vector<char> bytes = root ? file_bytes(previous) : std::vector<char>();
  std::vector<double> checkpoint_s, plain_s, prune_s;
  const std::string plain_path = (fs::path(out_dir) / "checkpoints" / "plain.bin").string();
  for (int r = 0; r < repeats; ++r) {
    // The plain write goes first on odd repeats: neither side always follows
    // the other's I/O.
    const bool plain_first = r % 2 == 1;
    if (plain_first) {
      settle();
      if (root) plain_s.push_back(plain_write(plain_path, bytes));
    }
    settle();
    const double start = now();
    // keep = all: deleting the previous checkpoint is not writing this one;
    // it is timed on its own below (a `discard` mount makes it costly).
    const std::string path = io::save_checkpoint(
        out_dir, *run.params, {r + 1, r + 1, mpi.world().size, 0, 0, run.deck_text}, {}, repeats, MPI_COMM_WORLD);
    checkpoint_s.push_back(now() - start);
    if (root) {
      const double prune_start = now();
      fs::remove(previous);
      prune_s.push_back(now() - prune_start);
    }
    previous = path;
    if (!plain_first) {
      settle();
      if (root) plain_s.push_back(plain_write(plain_path, bytes));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (!root) return 0;
  std::vector<double> ratios;
  for (size_t i = 0; i < checkpoint_s.size(); ++i) ratios.push_back(plain_s[i] / checkpoint_s[i]);
  const double mib = static_cast<double>(bytes.size()) / (1 << 20);
  const double c = median(checkpoint_s), p = median(plain_s);
  std::cout << fmt::format(
      "| {} | {} | {:.1f} | {:.3f} | {:.1f} | {:.3f} | {:.1f} | **{:.2f}x** | {:.2f}x | {:.3f} | {} |\n", label,
      mpi.world().size, mib, c, mib / c, p, mib / p, p / c, median(ratios), median(prune_s), load_average());
  std::cerr << fmt::format(
      "{}: first (warm-up) checkpoint s {:.3f}; checkpoint s {:.3f}; plain s {:.3f}; prune s {:.3f}\n", label, first_s,
      fmt::join(checkpoint_s, " "), fmt::join(plain_s, " "), fmt::join(prune_s, " "));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  try {
    return run(argc, argv, mpi);
  } catch (const std::exception& e) {
    return dist::report_fatal(e);
  }
}
