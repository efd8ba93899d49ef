// Checkpoint write bandwidth against plain sequential writes of the same
// bytes on the same disk, in the same run.
//
// Builds the deck's model sharded over the launch's ranks (as `ditrl train`
// does), writes one untimed checkpoint, then `repeats` times (each timed
// write after a settle pause, the order reversed on odd repeats):
//   checkpoint: io::save_checkpoint (every rank its slabs, fsync, tmp ->
//               rename -> latest), timed on rank 0 from a barrier to the return
//   plain:      rank 0 write()s the bytes of the warm-up checkpoint file (read
//               into memory once) to a file in the same directory in 4 MiB
//               blocks, then fsync()s: the page-cache write every tool does
//   direct:     the same with O_DIRECT (the tail below 4 KiB buffered): the
//               disk's own speed, which the checkpoint's bulk is written at
// and prints one markdown row with the medians, the ratios plain seconds /
// checkpoint seconds (= checkpoint bandwidth / plain bandwidth) as ratio of
// medians and median of per-repeat ratios, the same against direct, and the
// time to delete the previous checkpoint (outside all timings, as removing
// the plain files is).
//
//   mpiexec -n N bench_checkpoint DECK OUT_DIR LABEL [repeats] [k=v override ...]

#include <ditrl/app/run.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/hashed_write.hpp>

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
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

constexpr int64_t kBlock = 4 << 20;

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

// The bytes of `path` (the warm-up checkpoint), in memory aligned for
// O_DIRECT: the plain writes send the very bytes a checkpoint holds, from
// memory as a writer would, not one cache-resident block over and over.
struct Payload {
  std::unique_ptr<char, AlignedFree> data;
  int64_t size = 0;
};

Payload file_bytes(const std::string& path) {
  Payload bytes;
  bytes.size = static_cast<int64_t>(fs::file_size(path));
  bytes.data.reset(static_cast<char*>(
      std::aligned_alloc(io::kDirectAlignment, (bytes.size / io::kDirectAlignment + 1) * io::kDirectAlignment)));
  std::ifstream in(path, std::ios::binary);
  if (!bytes.data || !in.read(bytes.data.get(), bytes.size)) fail("bench_checkpoint: cannot read {}", path);
  return bytes;
}

void write_all(int fd, const char* data, int64_t size, int64_t offset, const std::string& path) {
  for (int64_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, static_cast<size_t>(std::min(kBlock, size - done)), offset + done);
    if (n <= 0) fail("bench_checkpoint: write to {} failed", path);
    done += n;
  }
}

int open_for_writing(const std::string& path, int extra_flags) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | extra_flags, 0644);
  if (fd < 0) fail("bench_checkpoint: cannot create {}", path);
  return fd;
}

// direct: the whole 4 KiB blocks with O_DIRECT, the rest through the page cache.
double plain_write(const std::string& path, const Payload& bytes, bool direct) {
  const double start = now();
  const int fd = open_for_writing(path, O_TRUNC | (direct ? O_DIRECT : 0));
  const int64_t bulk = direct ? bytes.size / io::kDirectAlignment * io::kDirectAlignment : bytes.size;
  write_all(fd, bytes.data.get(), bulk, 0, path);
  if (bulk < bytes.size) {
    const int tail = open_for_writing(path, 0);
    write_all(tail, bytes.data.get() + bulk, bytes.size - bulk, bulk, path);
    ::close(tail);
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

struct Timings {
  std::vector<double> checkpoint_s, plain_s, direct_s, prune_s;
};

// The writes of one launch: checkpoints of `state`, each replacing the
// previous one (whose removal is timed on its own), and rank 0's plain
// writes of the same bytes to a file beside them.
class Writes {
 public:
  Writes(const std::string& out_dir, const io::TrainingState& state, const std::string& deck, int repeats,
         const dist::WorldInfo& world)
      : out_dir_(out_dir),
        state_(state),
        deck_(deck),
        repeats_(repeats),
        world_size_(world.size),
        root_(world.rank == 0),
        plain_path_((fs::path(out_dir) / "checkpoints" / "plain.bin").string()) {
    if (root_) fs::remove_all(fs::path(out_dir) / "checkpoints");
  }

  // Untimed warm-up: the first checkpoint also pays first-touch page faults
  // and HDF5/MPI-IO start-up, which a training run pays once. Its seconds.
  double warm_up() {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now();
    previous_ = io::save_checkpoint(out_dir_, state_, {0, 0, world_size_, 0, 0, deck_}, 1, MPI_COMM_WORLD);
    const double seconds = now() - start;
    if (root_) bytes_ = file_bytes(previous_);
    return seconds;
  }

  void checkpoint(int r) {
    settle();
    const double start = now();
    // keep = all: deleting the previous checkpoint is not writing this one;
    // it is timed on its own below (a `discard` mount makes it costly).
    const std::string path =
        io::save_checkpoint(out_dir_, state_, {r + 1, r + 1, world_size_, 0, 0, deck_}, repeats_, MPI_COMM_WORLD);
    t_.checkpoint_s.push_back(now() - start);
    if (root_) {
      const double prune_start = now();
      fs::remove(previous_);
      t_.prune_s.push_back(now() - prune_start);
    }
    previous_ = path;
  }

  void plain(bool direct) {
    settle();
    if (root_) (direct ? t_.direct_s : t_.plain_s).push_back(plain_write(plain_path_, bytes_, direct));
  }

  const Timings& timings() const { return t_; }
  int64_t bytes() const { return bytes_.size; }

 private:
  const std::string out_dir_;
  const io::TrainingState& state_;
  const std::string deck_;
  const int repeats_;
  const int64_t world_size_;
  const bool root_;
  const std::string plain_path_;
  std::string previous_;
  Payload bytes_;
  Timings t_;
};

// The results table's row (stdout) and every timing (stderr).
void report(const std::string& label, int world_size, int64_t bytes, const Timings& t, double first_s) {
  auto paired = [&](const std::vector<double>& plain) {
    std::vector<double> ratios;
    for (size_t i = 0; i < t.checkpoint_s.size(); ++i) ratios.push_back(plain[i] / t.checkpoint_s[i]);
    return median(ratios);
  };
  const double mib = static_cast<double>(bytes) / (1 << 20);
  const double c = median(t.checkpoint_s), p = median(t.plain_s), d = median(t.direct_s);
  std::cout << fmt::format(
      "| {} | {} | {:.1f} | {:.3f} | {:.1f} | {:.3f} | {:.1f} | **{:.2f}x** | {:.2f}x | {:.3f} | {:.1f} | {:.2f}x | "
      "{:.2f}x | {:.3f} | {} |\n",
      label, world_size, mib, c, mib / c, p, mib / p, p / c, paired(t.plain_s), d, mib / d, d / c, paired(t.direct_s),
      median(t.prune_s), load_average());
  std::cerr << fmt::format(
      "{}: first (warm-up) checkpoint s {:.3f}; checkpoint s {:.3f}; plain s {:.3f}; direct s {:.3f}; prune s {:.3f}\n",
      label, first_s, fmt::join(t.checkpoint_s, " "), fmt::join(t.plain_s, " "), fmt::join(t.direct_s, " "),
      fmt::join(t.prune_s, " "));
}

int run(int argc, char** argv, dist::Runtime& mpi) {
  if (argc < 4) fail("usage: bench_checkpoint DECK OUT_DIR LABEL [repeats] [k=v ...]");
  const std::string out_dir = argv[2], label = argv[3];
  const int repeats = argc > 4 ? std::stoi(argv[4]) : 3;
  std::vector<std::string> overrides{"run.out_dir=" + out_dir, "run.deterministic=false"};
  for (int i = 5; i < argc; ++i) overrides.emplace_back(argv[i]);
  app::Run run = app::open_run(config::load_deck(argv[1], overrides), mpi);
  const io::TrainingState state = app::training_state(run);
  at::set_num_threads(mpi.default_threads());  // as `ditrl train` outside deterministic mode
  Writes writes(out_dir, state, run.deck_text, repeats, mpi.world());
  const double first_s = writes.warm_up();
  for (int r = 0; r < repeats; ++r) {
    // Reversed on odd repeats: no kind always follows another's I/O.
    if (r % 2 == 0) {
      writes.checkpoint(r), writes.plain(false), writes.plain(true);
    } else {
      writes.plain(true), writes.plain(false), writes.checkpoint(r);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (mpi.world().rank == 0) report(label, mpi.world().size, writes.bytes(), writes.timings(), first_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::unique_ptr<dist::Runtime> runtime = dist::Runtime::create({});
    return run(argc, argv, *runtime);
  } catch (const std::exception& e) {
    return dist::report_fatal(e);
  }
}
