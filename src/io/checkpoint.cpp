#include <ditrl/dist/runtime.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>
#include <ditrl/fault_injection.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/hashed_write.hpp>
#include <ditrl/io/sha256.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

namespace ditrl::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "ditrl-checkpoint-2";
constexpr const char* kChunkedFormat = "ditrl-checkpoint-1";  // Fletcher-32 chunks: still loads
constexpr int kDigestChars = 64;

int comm_rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

std::vector<hsize_t> dims(const std::vector<int64_t>& shape) {
  return {shape.begin(), shape.end()};
}

// Space allocated when the dataset is created and no fill values written:
// the ranks' slabs cover every element, and creation then does no data I/O.
h5::DatasetOptions preallocated() {
  h5::DatasetOptions options;
  options.preallocate = true;
  return options;
}

// One dataset of the checkpoint and this rank's slab of it (values undefined
// when the rank owns none of it). Every rank lists the same datasets in the
// same order.
struct Entry {
  std::string path;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  at::Tensor values;  // fp32, flat
};

// The generators a run on `device` draws from, as dataset paths: the CPU
// one always, the device's own on CUDA. A checkpoint loads on either: a
// generator missing from the file, or not in this run, is left as seeded.
std::vector<std::pair<std::string, c10::Device>> generators(c10::Device device) {
  std::vector<std::pair<std::string, c10::Device>> list = {{"/rng/torch_cpu", c10::kCPU}};
  if (device.is_cuda()) list.emplace_back("/rng/torch_cuda", device);
  return list;
}

std::vector<Entry> entries(const TrainingState& state) {
  std::vector<Entry> list;
  for (const StateTensor& t : state.tensors) {
    const bool mine = t.begin < t.end;
    auto add = [&](const std::string& path, const at::Tensor& values) {
      Entry e{path, t.shape, t.begin, {}};
      if (mine) e.values = values.to(at::kFloat).contiguous().flatten();
      list.push_back(std::move(e));
    };
    add("/model/" + t.name, t.master);
    add("/optimizer/" + t.name + "/exp_avg", t.exp_avg);
    add("/optimizer/" + t.name + "/exp_avg_sq", t.exp_avg_sq);
    for (size_t k = 0; k < state.extra_sets.size(); ++k)
      add("/extra/" + state.extra_sets[k] + "/" + t.name, mine ? t.extra.at(k) : at::Tensor());
  }
  return list;
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("checkpoint {}: cannot reopen to sync it: {} (errno {})", path, std::strerror(errno), errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) fail_write(error, fmt::format("checkpoint {}: fsync failed", path));
}

// How a rank's part of a step ended, as the agreement carries it (the
// largest wins): a full disk is named as such on every rank.
enum Outcome : int { kDone = 0, kFailed = 1, kNoSpace = 2 };

// Runs `step`, whose failure may hit this rank alone, then agrees over comm:
// when any rank failed, every rank runs `cleanup` and raises an
// AgreedError, so no rank is left in the next collective.
template <class Step, class Cleanup>
void agree(MPI_Comm comm, const char* what, Step step, Cleanup cleanup,
           const std::string& outcome = "checkpoint not written") {
  std::string failure;
  int mine = kDone, any = kDone;
  try {
    step();
  } catch (const DiskFull& e) {
    failure = e.what();
    mine = kNoSpace;
  } catch (const ditrl::Error& e) {
    failure = e.what();
    mine = kFailed;
  }
  {
    dist::WaitScope waiting("io", fmt::format("agreement after {}", what));
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm);
  }
  if (any == kDone) return;
  cleanup();
  const std::string why = any == kNoSpace ? outcome + ": disk full" : outcome;
  throw dist::AgreedError(failure.empty() ? fmt::format("{}: another rank failed {} (see its message)", why, what)
                                          : fmt::format("{}: {}", why, failure));
}

// A checkpoint that failed on some rank: rank 0 closes its file (errors
// ignored: the disk may be full) and removes it, so a full disk gets its
// space back. The previous checkpoint and `latest` stay as they were.
void abandon(std::optional<h5::File>& file, const fs::path& tmp_path) {
  if (file) {
    try {
      file->close();
    } catch (const ditrl::Error&) {
    }
    file.reset();
  }
  std::error_code ignored;
  fs::remove(tmp_path, ignored);
}

void write_pointer(const fs::path& dir, const std::string& target) {
  const fs::path tmp = dir / "latest.tmp";
  {
    std::ofstream out(tmp);
    out << target << "\n";
    out.close();  // the bytes reach the file system here: a full disk fails now, not silently in a destructor
    if (!out) fail_write(errno, fmt::format("cannot write {}", tmp.string()));  // the caller removes it
  }
  fsync_file(tmp.string());
  std::error_code ec;
  fs::rename(tmp, dir / "latest", ec);
  if (ec) fail("cannot rename {} to latest: {}", tmp.string(), ec.message());
}

std::vector<std::pair<int64_t, fs::path>> checkpoints_in(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  const std::regex pattern(R"(step-(\d+)\.h5)");
  std::smatch m;
  if (!fs::exists(dir)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern)) found.emplace_back(std::stoll(m[1]), entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string digest(const at::Tensor& flat) {
  return sha256(flat.data_ptr(), static_cast<size_t>(flat.numel() * flat.element_size()));
}

// ---------------------------------------------------------------- manifest
//
// The root attribute `sha256_manifest` lists the SHA-256 of every writer's
// slab, one line each: "<dataset> <begin> <end> <hex digest>" with [begin,
// end) a flat element range and the digest over its stored bytes. It is
// written after all data, before `complete`.

struct Slab {
  int64_t begin = 0, end = 0;
  std::string digest;
};
using Manifest = std::map<std::string, std::vector<Slab>>;

// Every rank's slab lines, on rank 0 (which writes the attribute); empty elsewhere.
std::string gather_manifest(const std::vector<Entry>& list, const std::vector<std::string>& digests, MPI_Comm comm) {
  std::string mine;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].values.defined())
      mine +=
          fmt::format("{} {} {} {}\n", list[i].path, list[i].begin, list[i].begin + list[i].values.numel(), digests[i]);
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  const int my_bytes = static_cast<int>(mine.size());
  std::vector<int> bytes(ranks), offsets(ranks, 0);
  dist::WaitScope waiting("io", "checkpoint manifest gather");
  MPI_Gather(&my_bytes, 1, MPI_INT, bytes.data(), 1, MPI_INT, 0, comm);
  for (int r = 1; r < ranks; ++r) offsets[r] = offsets[r - 1] + bytes[r - 1];
  std::string all(comm_rank(comm) == 0 ? static_cast<size_t>(offsets.back() + bytes.back()) : 0, '\0');
  MPI_Gatherv(mine.data(), my_bytes, MPI_CHAR, all.data(), bytes.data(), offsets.data(), MPI_CHAR, 0, comm);
  return all;
}

Manifest parse_manifest(const h5::File& file) {
  if (!file.has_attr("sha256_manifest"))
    fail("checkpoint {} is corrupted: no sha256_manifest attribute", file.file_name());
  Manifest manifest;
  std::istringstream lines(file.string_attr("sha256_manifest"));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string path;
    Slab s;
    if (!(fields >> path >> s.begin >> s.end >> s.digest) || s.digest.size() != kDigestChars || s.end < s.begin)
      fail("checkpoint {} is corrupted: bad sha256_manifest line \"{}\"", file.file_name(), line);
    manifest[path].push_back(std::move(s));
  }
  for (auto& [path, slabs] : manifest)
    std::sort(slabs.begin(), slabs.end(), [](const Slab& a, const Slab& b) { return a.begin < b.begin; });
  return manifest;
}

// Elements [begin, end) of a dataset, read as the union of the written slabs
// that overlap them so that each of those slabs is checked against its digest.
at::Tensor read_verified(const h5::Dataset& dataset, const std::vector<Slab>& slabs, int64_t begin, int64_t end) {
  int64_t span_begin = begin, span_end = end;
  for (const Slab& s : slabs)
    if (s.begin < end && s.end > begin)
      span_begin = std::min(span_begin, s.begin), span_end = std::max(span_end, s.end);
  const at::Tensor span = dataset.read_flat_range(span_begin, span_end - span_begin, /*collective=*/false);
  int64_t covered = begin;
  for (const Slab& s : slabs) {
    if (s.end <= begin || s.begin >= end) continue;
    if (s.begin > covered) break;  // a gap: reported below
    if (digest(span.slice(0, s.begin - span_begin, s.end - span_begin)) != s.digest)
      fail("elements [{}, {}) do not match their SHA-256", s.begin, s.end);
    covered = std::max(covered, s.end);
  }
  if (covered < end) fail("elements [{}, {}) are covered by no SHA-256 slab", covered, end);
  return span.slice(0, begin - span_begin, end - span_begin);
}

// A rank's range of one dataset, checked against the manifest, or (format 1,
// no manifest) by HDF5's Fletcher-32 filter.
at::Tensor read_range(const h5::File& file, const std::optional<Manifest>& manifest, const std::string& path,
                      const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  if (!file.exists(path))
    fail("checkpoint {}: no dataset {} (was it written for another model?)", file.file_name(), path);
  h5::Dataset d = file.open_dataset(path);
  const std::vector<hsize_t> stored = d.shape();
  if (std::vector<int64_t>(stored.begin(), stored.end()) != shape)
    fail("checkpoint {}: {} has shape [{}], the model's parameter is [{}]", file.file_name(), path,
         fmt::join(stored, ", "), fmt::join(shape, ", "));
  try {
    // Independent reads: a failure then raises on the rank that hit it
    // (which aborts the job) instead of stalling a collective.
    if (!manifest) return d.read_flat_range(begin, end - begin, /*collective=*/false);
    auto slabs = manifest->find(path);
    if (slabs == manifest->end()) fail("no slab of it in sha256_manifest");
    return read_verified(d, slabs->second, begin, end);
  } catch (const ditrl::Error& e) {
    fail("checkpoint {} is corrupted: reading {} failed (checksum or truncation): {}", file.file_name(), path,
         e.what());
  }
}

}  // namespace

namespace {

// Rank 0 writes the file's structure and metadata alone, through HDF5's
// serial driver; every rank writes its own slabs' bytes (write_hashed). So no
// step of a save is a collective inside HDF5, where a rank whose write failed
// (a full disk) would leave the others waiting: each step's failure is
// agreed on in ditrl's own MPI calls (agree) and the save ends on every rank.
class CheckpointWriter {
 public:
  CheckpointWriter(const fs::path& dir, const std::string& name, MPI_Comm comm)
      : dir_(dir), name_(name), tmp_path_(dir / (name + ".tmp")), comm_(comm), root_(comm_rank(comm) == 0) {}

  // Rank 0 creates the file and every dataset (contiguous, allocated at
  // creation: the data's place in the file is fixed); every rank learns
  // where each dataset starts.
  std::vector<int64_t> create(const std::vector<Entry>& list) {
    std::vector<int64_t> offsets(list.size());
    agree(
        comm_, "creating the checkpoint",
        [&] {
          std::error_code ec;
          fs::create_directories(dir_, ec);
          if (ec) fail("cannot create {}: {}", dir_.string(), ec.message());
          if (root_) offsets = create_datasets(list);
        },
        [&] { cleanup(); });
    dist::WaitScope waiting("io", "checkpoint layout broadcast");
    MPI_Bcast(offsets.data(), static_cast<int>(offsets.size()), MPI_INT64_T, 0, comm_);
    return offsets;
  }

  // Disk full, EIO, quota: a rank's own writes can fail alone. One worker
  // more than compute threads: the disk is kept busy while the others copy
  // and hash.
  std::vector<std::string> write_slabs(const std::vector<ByteRange>& slabs, c10::Device device) {
    std::vector<std::string> digests;
    agree(
        comm_, "writing its checkpoint slabs",
        [&] {
          digests =
              write_hashed(tmp_path_.string(), slabs, {at::get_num_threads() + 1, /*direct=*/true, device}).digests;
        },
        [&] { cleanup(); });
    return digests;
  }

  // Rank 0 adds the generator states, the manifest and the attributes and
  // closes the file (writing its metadata); every rank then fsyncs: what it
  // wrote through its own node's page cache (slab edges, rank 0's metadata)
  // is not durable before, nor are direct writes still in a disk's cache.
  void finish(std::string manifest, const CheckpointMeta& meta, c10::Device device) {
    agree(
        comm_, "closing and syncing the checkpoint",
        [&] {
          if (root_) write_metadata(std::move(manifest), meta, device);
          fsync_file(tmp_path_.string());
        },
        [&] { cleanup(); });
  }

  // Rank 0 renames the file to its final name, moves `latest` to it and
  // removes the checkpoints beyond `keep`. A failure here leaves a complete
  // checkpoint that `latest` may not name yet (`--resume auto` finds it).
  void commit(int64_t keep) {
    agree(
        comm_, "committing the checkpoint",
        [&] {
          if (root_) commit_on_root(keep);
        },
        [&] {
          if (!root_) return;
          std::error_code ignored;
          fs::remove(tmp_path_, ignored);
          fs::remove(dir_ / "latest.tmp", ignored);
        },
        fmt::format("checkpoint {} not committed (latest unchanged)", name_));
  }

  std::string path() const { return (dir_ / name_).string(); }

 private:
  std::vector<int64_t> create_datasets(const std::vector<Entry>& list) {
    // Large datasets start on O_DIRECT block boundaries, so whole slabs go out directly.
    file_ = h5::File::create(tmp_path_.string(), MPI_COMM_NULL,
                             {/*many_objects=*/true, /*data_alignment=*/kDirectAlignment});
    std::vector<int64_t> offsets;
    for (const Entry& e : list)
      offsets.push_back(file_->create_dataset(e.path, at::kFloat, dims(e.shape), preallocated()).file_offset());
    return offsets;
  }

  void write_metadata(std::string manifest, const CheckpointMeta& meta, c10::Device device) {
    for (const auto& [path, on] : generators(device)) {
      const at::Tensor rng = at::globalContext().defaultGenerator(on).get_state();
      file_->create_dataset(path, at::kByte, {static_cast<hsize_t>(rng.numel())}).write(rng);
      manifest += fmt::format("{} 0 {} {}\n", path, rng.numel(), digest(rng));
    }
    file_->set_attr("sha256_manifest", manifest);
    file_->set_attr("format", kFormat);
    file_->set_attr("step", meta.step);
    file_->set_attr("rollout_id", meta.rollout_id);
    file_->set_attr("world_size", meta.world_size);
    file_->set_attr("adam_step", meta.adam_step);
    file_->set_attr("data_position", meta.data_position);
    file_->set_attr("deck", meta.deck);
    file_->set_attr("complete", int64_t{1});
    file_->close();
  }

  void commit_on_root(int64_t keep) {
    std::error_code ec;
    fs::rename(tmp_path_, dir_ / name_, ec);
    if (ec) fail("cannot rename {} to {}: {}", tmp_path_.string(), name_, ec.message());
    write_pointer(dir_, name_);
    // Committed: a checkpoint beyond `keep` that cannot be removed is only reported.
    const auto all = checkpoints_in(dir_);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
      if (!fs::remove(all[i].second, ec) && ec)
        spdlog::warn("checkpoint {} beyond checkpoint.keep = {} not removed: {}", all[i].second.string(), keep,
                     ec.message());
  }

  void cleanup() {
    if (root_) abandon(file_, tmp_path_);
  }

  fs::path dir_;
  std::string name_;
  fs::path tmp_path_;
  MPI_Comm comm_;
  bool root_;
  std::optional<h5::File> file_;  // rank 0's
};

}  // namespace

std::string save_checkpoint(const std::string& out_dir, const TrainingState& state, const CheckpointMeta& meta,
                            int64_t keep, MPI_Comm comm) {
  CheckpointWriter writer(fs::path(out_dir) / "checkpoints", fmt::format("step-{}.h5", meta.step), comm);
  const std::vector<Entry> list = entries(state);
  const std::vector<int64_t> offsets = writer.create(list);
  // Each rank writes its slabs itself, hashing them on the way: no collective
  // per dataset, no HDF5 selection per write, no page cache for the bulk.
  std::vector<ByteRange> slabs(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Entry& e = list[i];
    if (e.values.defined())
      slabs[i] = {offsets[i] + e.begin * e.values.element_size(), e.values.data_ptr(),
                  e.values.numel() * e.values.element_size()};
  }
  // The slabs were computed on the device's streams; the staging copies run on others.
  if (state.device.is_cuda()) c10::impl::VirtualGuardImpl(state.device.type()).synchronizeDevice(state.device.index());
  const std::vector<std::string> digests = writer.write_slabs(slabs, state.device);
  // A rank killed halfway through: `latest` must stay on the previous, loadable checkpoint.
  if (fault_requested("DITRL_TEST_KILL_IN_CHECKPOINT", comm_rank(comm), meta.step)) std::raise(SIGKILL);
  std::string manifest = gather_manifest(list, digests, comm);
  // A rank stopped before the metadata: rank 0 must not wait for it forever.
  if (fault_requested("DITRL_TEST_STOP_IN_CHECKPOINT", comm_rank(comm), meta.step)) std::raise(SIGSTOP);
  writer.finish(std::move(manifest), meta, state.device);
  writer.commit(keep);
  return writer.path();
}

std::string resolve_checkpoint(const std::string& out_dir, const std::string& which) {
  if (which != "latest") {
    if (!fs::exists(which)) fail("checkpoint {}: no such file", which);
    return which;
  }
  const fs::path dir = fs::path(out_dir) / "checkpoints";
  const fs::path pointer = dir / "latest";
  std::ifstream in(pointer);
  std::string target;
  if (!in || !std::getline(in, target) || target.empty())
    fail("--resume latest: no checkpoint pointer {} (no checkpoint was completed in {})", pointer.string(), out_dir);
  const fs::path path = dir / target;
  if (!fs::exists(path))
    fail("--resume latest: {} points to {}, which does not exist", pointer.string(), path.string());
  return path.string();
}

ResumeCandidates resume_candidates(const std::string& out_dir) {
  const fs::path dir = fs::path(out_dir) / "checkpoints";
  ResumeCandidates out;
  const fs::path pointer = dir / "latest";
  if (fs::exists(pointer)) {
    std::ifstream in(pointer);
    std::string target;
    if (!in || !std::getline(in, target) || target.empty() || target.find('/') != std::string::npos)
      out.notes.push_back(fmt::format("{} is unreadable or not a checkpoint name", pointer.string()));
    else if (!fs::exists(dir / target))
      out.notes.push_back(fmt::format("{} names {}, which does not exist", pointer.string(), target));
    else
      out.paths.push_back((dir / target).string());
  }
  const auto all = checkpoints_in(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (out.paths.empty() || it->second.string() != out.paths.front()) out.paths.push_back(it->second.string());
  return out;
}

namespace {

// The checkpoint's manifest (none for format 1) after checking that it is a
// complete ditrl checkpoint.
std::optional<Manifest> checked_manifest(const h5::File& file, const std::string& path) {
  const std::string format = file.has_attr("format") ? file.string_attr("format") : "";
  if (format != kFormat && format != kChunkedFormat)
    fail("checkpoint {}: not a ditrl checkpoint (format attribute missing or not {})", path, kFormat);
  if (!file.has_attr("complete") || file.int_attr("complete") != 1)
    fail("checkpoint {}: incomplete (its writer did not finish)", path);
  return format == kChunkedFormat ? std::nullopt : std::optional<Manifest>(parse_manifest(file));
}

CheckpointMeta stored_meta(const h5::File& file) {
  CheckpointMeta meta;
  meta.step = file.int_attr("step");
  meta.rollout_id = file.int_attr("rollout_id");
  meta.world_size = file.int_attr("world_size");
  meta.adam_step = file.int_attr("adam_step");
  meta.data_position = file.int_attr("data_position");
  meta.deck = file.string_attr("deck");
  return meta;
}

// Every dataset below `group`, by full path.
void datasets_below(const h5::File& file, const std::string& group, std::vector<std::string>& out) {
  for (const std::string& child : file.open_group(group).children()) {
    const std::string path = group + "/" + child;
    H5O_info_t info;
    if (H5Oget_info_by_name(file.id(), path.c_str(), &info, H5P_DEFAULT) < 0) continue;
    if (info.type == H5O_TYPE_GROUP)
      datasets_below(file, path, out);
    else
      out.push_back(path);
  }
}

int64_t elements(const h5::File& file, const std::string& dataset) {
  int64_t n = 1;
  for (hsize_t d : file.open_dataset(dataset).shape()) n *= static_cast<int64_t>(d);
  return n;
}

CheckpointMeta read_checkpoint(const h5::File& file, const std::string& path, const TrainingState& state) {
  const std::optional<Manifest> manifest = checked_manifest(file, path);

  for (const StateTensor& t : state.tensors) {
    if (t.begin == t.end) continue;  // this rank owns no element of it
    auto load = [&](const std::string& dataset, at::Tensor target) {
      target.copy_(read_range(file, manifest, dataset, t.shape, t.begin, t.end).view(target.sizes()));
    };
    load("/model/" + t.name, t.master);
    load("/optimizer/" + t.name + "/exp_avg", t.exp_avg);
    load("/optimizer/" + t.name + "/exp_avg_sq", t.exp_avg_sq);
    for (size_t k = 0; k < state.extra_sets.size(); ++k)
      load("/extra/" + state.extra_sets[k] + "/" + t.name, t.extra.at(k));
  }
  for (const auto& [path, on] : generators(state.device)) {
    if (!file.exists(path)) continue;
    const std::vector<hsize_t> rng_shape = file.open_dataset(path).shape();
    at::Generator generator = at::globalContext().defaultGenerator(on);
    generator.set_state(read_range(file, manifest, path, {rng_shape.begin(), rng_shape.end()}, 0,
                                   static_cast<int64_t>(rng_shape.at(0))));
  }

  return stored_meta(file);
}

}  // namespace

CheckpointMeta verify_checkpoint(const std::string& path) {
  const h5::File file = [&] {
    try {
      return h5::File::open(path);
    } catch (const h5::Error& e) {
      fail("checkpoint {} cannot be opened (truncated or not HDF5): {}", path, e.what());
    }
  }();
  const std::optional<Manifest> manifest = checked_manifest(file, path);
  std::vector<std::string> datasets;
  for (const char* group : {"/model", "/optimizer", "/extra", "/rng"})
    if (file.exists(group)) datasets_below(file, group, datasets);
  for (const std::string& dataset : datasets) {
    const std::vector<hsize_t> stored = file.open_dataset(dataset).shape();
    const std::vector<int64_t> shape(stored.begin(), stored.end());
    if (!manifest) {
      read_range(file, manifest, dataset, shape, 0, elements(file, dataset));
      continue;
    }
    // Slab by slab, so that a full fine-tune's largest parameter is never held whole.
    const auto slabs = manifest->find(dataset);
    if (slabs == manifest->end()) fail("checkpoint {} is corrupted: {} has no slab in sha256_manifest", path, dataset);
    int64_t covered = 0;
    for (const Slab& slab : slabs->second) {
      if (slab.begin > covered) break;
      read_range(file, manifest, dataset, shape, slab.begin, slab.end);
      covered = std::max(covered, slab.end);
    }
    if (covered < elements(file, dataset))
      fail("checkpoint {} is corrupted: {} elements [{}, {}) are covered by no SHA-256 slab", path, dataset, covered,
           elements(file, dataset));
  }
  return stored_meta(file);
}

std::string checkpoint_deck(const std::string& path) {
  try {
    const h5::File file = h5::File::open(path);
    return file.has_attr("deck") ? file.string_attr("deck") : "";
  } catch (const ditrl::Error&) {
    return "";
  }
}

CheckpointMeta load_checkpoint(const std::string& path, const TrainingState& state, MPI_Comm comm) {
  // The same file on every rank: opening fails on all of them alike.
  h5::File file = [&] {
    try {
      return h5::File::open(path, h5::File::Mode::ReadOnly, comm);
    } catch (const h5::Error& e) {
      throw dist::AgreedError(
          fmt::format("checkpoint {} cannot be opened (truncated or not HDF5): {}", path, e.what()));
    }
  }();
  // Each rank verifies its own ranges, so a corrupt slab is seen by one rank:
  // they agree before the (collective) close.
  CheckpointMeta meta;
  agree(
      comm, "verifying", [&] { meta = read_checkpoint(file, path, state); },
      [&] {
        try {
          file.close();
        } catch (const ditrl::Error&) {
        }
      },
      fmt::format("checkpoint {} did not verify", path));
  file.close();
  return meta;
}

struct TrainedWeights::Impl {
  h5::File file;
  std::optional<Manifest> manifest;
  std::map<std::string, std::vector<int64_t>> shapes;
};

TrainedWeights::TrainedWeights(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->file = h5::File::open(path);
  h5::File& file = impl_->file;
  const std::string format = file.has_attr("format") ? file.string_attr("format") : "";
  if (format != kFormat && format != kChunkedFormat) fail("checkpoint {}: not a ditrl checkpoint", path);
  if (format != kChunkedFormat) impl_->manifest = parse_manifest(file);
  // Dataset names are the canonical parameter names (dots, no nesting).
  for (const std::string& name : file.open_group("/model").children()) {
    const std::vector<hsize_t> shape = file.open_dataset("/model/" + name).shape();
    impl_->shapes[name] = std::vector<int64_t>(shape.begin(), shape.end());
  }
}

TrainedWeights::~TrainedWeights() = default;

std::vector<std::string> TrainedWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, shape] : impl_->shapes) out.push_back(name);
  return out;
}

bool TrainedWeights::contains(const std::string& name) const {
  return impl_->shapes.count(name) > 0;
}

at::Tensor TrainedWeights::read(const std::string& name) const {
  const auto it = impl_->shapes.find(name);
  if (it == impl_->shapes.end()) fail("checkpoint {}: no trained parameter '{}'", impl_->file.file_name(), name);
  int64_t numel = 1;
  for (int64_t d : it->second) numel *= d;
  return read_range(impl_->file, impl_->manifest, "/model/" + name, it->second, 0, numel).view(it->second);
}

std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& path) {
  const TrainedWeights trained(path);
  std::map<std::string, at::Tensor> weights;
  for (const std::string& name : trained.names()) weights[name] = trained.read(name);
  return weights;
}

}  // namespace ditrl::io
