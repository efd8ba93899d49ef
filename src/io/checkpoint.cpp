#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/h5.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

namespace ditrl::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "ditrl-checkpoint-1";
constexpr int64_t kChunkBytes = 4 << 20;

int comm_rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

// Chunks of whole trailing rows up to ~4 MiB: Fletcher-32 needs a chunked layout.
h5::DatasetOptions checksummed(const std::vector<int64_t>& shape, int64_t element_bytes) {
  h5::DatasetOptions options;
  options.fletcher32 = true;
  if (shape.empty()) return options;  // scalars stay contiguous (and unchecked: no such parameters in the families)
  int64_t row = element_bytes;
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  const int64_t rows = std::clamp<int64_t>(kChunkBytes / std::max<int64_t>(row, 1), 1, std::max<int64_t>(shape[0], 1));
  options.chunk.assign(shape.begin(), shape.end());
  options.chunk[0] = static_cast<hsize_t>(rows);
  for (hsize_t& c : options.chunk) c = std::max<hsize_t>(c, 1);
  return options;
}

std::vector<hsize_t> dims(const std::vector<int64_t>& shape) { return {shape.begin(), shape.end()}; }

std::vector<shard::ShardPiece> trainable_pieces(shard::ShardedParams& params) {
  std::vector<shard::ShardPiece> pieces;
  for (shard::ShardPiece& p : params.pieces())
    if (p.trainable) pieces.push_back(std::move(p));
  return pieces;
}

// The trainable parameters, in layout order (the same on every rank).
std::vector<const shard::Slot*> trainable_slots(const shard::Layout& layout) {
  std::vector<const shard::Slot*> slots;
  for (const shard::UnitLayout& unit : layout.units)
    for (const shard::FlatGroup& group : unit.groups)
      if (group.trainable)
        for (const shard::Slot& slot : group.slots) slots.push_back(&slot);
  return slots;
}

// Fault injection for the e2e suite: DITRL_TEST_KILL_IN_CHECKPOINT="rank:step"
// kills that rank with SIGKILL halfway through writing that step's checkpoint,
// which must leave `latest` on the previous, loadable checkpoint.
void kill_point(MPI_Comm comm, int64_t step) {
  const char* spec = std::getenv("DITRL_TEST_KILL_IN_CHECKPOINT");
  if (!spec) return;
  int rank = -1;
  long long at_step = -1;
  if (std::sscanf(spec, "%d:%lld", &rank, &at_step) == 2 && rank == comm_rank(comm) && at_step == step)
    std::raise(SIGKILL);
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("checkpoint {}: cannot reopen to fsync", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("checkpoint {}: fsync failed", path);
}

void write_pointer(const fs::path& dir, const std::string& target) {
  const fs::path tmp = dir / "latest.tmp";
  {
    std::ofstream out(tmp);
    out << target << "\n";
    if (!out) fail("cannot write {}", tmp.string());
  }
  fsync_file(tmp.string());
  fs::rename(tmp, dir / "latest");
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

// One piece's range of a dataset (collective: every rank calls it per parameter).
void write_piece(h5::Group& file, const std::string& path, const std::vector<int64_t>& shape,
                 const shard::ShardPiece* piece, const at::Tensor& values) {
  h5::Dataset d = file.create_dataset(path, at::kFloat, dims(shape), checksummed(shape, 4));
  if (piece)
    d.write_flat_range(piece->begin, values.to(at::kFloat));
  else
    d.write_flat_range(0, at::empty({0}, at::kFloat));
}

void read_piece(const h5::File& file, const std::string& path, const std::vector<int64_t>& shape,
                const shard::ShardPiece* piece, at::Tensor target) {
  if (!file.exists(path)) fail("checkpoint {}: no dataset {} (was it written for another model?)", file.file_name(), path);
  h5::Dataset d = file.open_dataset(path);
  const std::vector<hsize_t> stored = d.shape();
  if (std::vector<int64_t>(stored.begin(), stored.end()) != shape)
    fail("checkpoint {}: {} has shape [{}], the model's parameter is [{}]", file.file_name(), path,
         fmt::join(stored, ", "), fmt::join(shape, ", "));
  try {
    // Independent reads: a checksum failure then raises on the rank that hit
    // it (which aborts the job) instead of stalling HDF5's collective path.
    if (piece) target.copy_(d.read_flat_range(piece->begin, piece->end - piece->begin, /*collective=*/false)
                                .view(target.sizes()));
  } catch (const h5::Error& e) {
    fail("checkpoint {} is corrupted: reading {} failed (checksum or truncation): {}", file.file_name(), path, e.what());
  }
}

}  // namespace

std::string save_checkpoint(const std::string& out_dir, shard::ShardedParams& params, const CheckpointMeta& meta,
                            const ExtraState& extra, int64_t keep, MPI_Comm comm) {
  const fs::path dir = fs::path(out_dir) / "checkpoints";
  const std::string name = fmt::format("step-{}.h5", meta.step);
  const fs::path final_path = dir / name;
  const fs::path tmp_path = dir / (name + ".tmp");
  const bool root = comm_rank(comm) == 0;
  if (root) fs::create_directories(dir);
  MPI_Barrier(comm);

  const std::vector<shard::ShardPiece> pieces = trainable_pieces(params);
  std::map<std::string, size_t> mine;
  for (size_t i = 0; i < pieces.size(); ++i) mine[pieces[i].name] = i;
  {
    h5::File file = h5::File::create(tmp_path.string(), comm);
    for (const shard::Slot* slot : trainable_slots(params.layout())) {
      const shard::Slot& p = *slot;
      auto it = mine.find(p.name);
      const shard::ShardPiece* piece = it == mine.end() ? nullptr : &pieces[it->second];
      write_piece(file, "/model/" + p.name, p.shape, piece, piece ? piece->master : at::Tensor());
      write_piece(file, "/optimizer/" + p.name + "/exp_avg", p.shape, piece, piece ? piece->exp_avg : at::Tensor());
      write_piece(file, "/optimizer/" + p.name + "/exp_avg_sq", p.shape, piece,
                  piece ? piece->exp_avg_sq : at::Tensor());
      for (const auto& [set, tensors] : extra)
        write_piece(file, "/extra/" + set + "/" + p.name, p.shape, piece,
                    piece ? tensors.at(it->second) : at::Tensor());
    }
    kill_point(comm, meta.step);
    const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
    file.create_dataset("/rng/torch_cpu", at::kByte, {static_cast<hsize_t>(rng.numel())}).write(rng);
    file.set_attr("format", kFormat);
    file.set_attr("step", meta.step);
    file.set_attr("rollout_id", meta.rollout_id);
    file.set_attr("world_size", meta.world_size);
    file.set_attr("adam_step", meta.adam_step);
    file.set_attr("data_position", meta.data_position);
    file.set_attr("deck", meta.deck);
    file.set_attr("complete", int64_t{1});
    file.flush();
  }
  MPI_Barrier(comm);
  if (root) {
    fsync_file(tmp_path.string());
    fs::rename(tmp_path, final_path);
    write_pointer(dir, name);
    const auto all = checkpoints_in(dir);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove(all[i].second);
  }
  MPI_Barrier(comm);
  return final_path.string();
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
  if (!fs::exists(path)) fail("--resume latest: {} points to {}, which does not exist", pointer.string(), path.string());
  return path.string();
}

CheckpointMeta load_checkpoint(const std::string& path, shard::ShardedParams& params, ExtraState& extra,
                               MPI_Comm comm) {
  h5::File file = [&] {
    try {
      return h5::File::open(path, h5::File::Mode::ReadOnly, comm);
    } catch (const h5::Error& e) {
      fail("checkpoint {} cannot be opened (truncated or not HDF5): {}", path, e.what());
    }
  }();
  if (!file.has_attr("format") || file.string_attr("format") != kFormat)
    fail("checkpoint {}: not a ditrl checkpoint (format attribute missing or not {})", path, kFormat);
  if (!file.has_attr("complete") || file.int_attr("complete") != 1)
    fail("checkpoint {}: incomplete (its writer did not finish)", path);

  const std::vector<shard::ShardPiece> pieces = trainable_pieces(params);
  std::map<std::string, size_t> mine;
  for (size_t i = 0; i < pieces.size(); ++i) mine[pieces[i].name] = i;
  for (const shard::Slot* slot : trainable_slots(params.layout())) {
    const shard::Slot& p = *slot;
    auto it = mine.find(p.name);
    const shard::ShardPiece* piece = it == mine.end() ? nullptr : &pieces[it->second];
    read_piece(file, "/model/" + p.name, p.shape, piece, piece ? piece->master : at::Tensor());
    read_piece(file, "/optimizer/" + p.name + "/exp_avg", p.shape, piece, piece ? piece->exp_avg : at::Tensor());
    read_piece(file, "/optimizer/" + p.name + "/exp_avg_sq", p.shape, piece, piece ? piece->exp_avg_sq : at::Tensor());
    for (auto& [set, tensors] : extra)
      read_piece(file, "/extra/" + set + "/" + p.name, p.shape, piece, piece ? tensors.at(it->second) : at::Tensor());
  }
  params.refresh_compute();
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(file.open_dataset("/rng/torch_cpu").read());

  CheckpointMeta meta;
  meta.step = file.int_attr("step");
  meta.rollout_id = file.int_attr("rollout_id");
  meta.world_size = file.int_attr("world_size");
  meta.adam_step = file.int_attr("adam_step");
  meta.data_position = file.int_attr("data_position");
  meta.deck = file.string_attr("deck");
  params.set_step_count(meta.adam_step);
  return meta;
}

std::map<std::string, at::Tensor> read_checkpoint_weights(const std::string& path) {
  h5::File file = h5::File::open(path);
  if (!file.has_attr("format") || file.string_attr("format") != kFormat)
    fail("checkpoint {}: not a ditrl checkpoint", path);
  std::map<std::string, at::Tensor> weights;
  const h5::Group model = file.open_group("/model");
  // Dataset names are the canonical parameter names (dots, no nesting).
  for (const std::string& name : model.children()) {
    try {
      weights[name] = model.open_dataset(name).read();
    } catch (const h5::Error& e) {
      fail("checkpoint {} is corrupted: reading /model/{} failed: {}", path, name, e.what());
    }
  }
  return weights;
}

}  // namespace ditrl::io
