#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/rollout/trajectory_file.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace ditrl::rollout {

namespace h5 = io::h5;

namespace {

std::vector<hsize_t> global_dims(const at::Tensor& local, int64_t total_rows) {
  std::vector<hsize_t> dims(local.sizes().begin(), local.sizes().end());
  dims[0] = static_cast<hsize_t>(total_rows);
  return dims;
}

void write_rows(h5::File& file, const std::string& path, const at::Tensor& local, int64_t first_row,
                int64_t total_rows) {
  file.create_dataset(path, local.scalar_type(), global_dims(local, total_rows))
      .write_rows(first_row, local.contiguous());
}

void write_whole(h5::File& file, const std::string& path, const at::Tensor& t) {
  std::vector<hsize_t> dims(t.sizes().begin(), t.sizes().end());
  file.create_dataset(path, t.scalar_type(), dims).write(t.contiguous());
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

class Reader {
 public:
  Reader(const std::string& path, int64_t first_row, int64_t count)
      : file_(h5::File::open(path)), path_(path), first_(first_row), count_(count) {}

  bool has(const std::string& name) const { return file_.exists(name); }

  h5::Dataset dataset(const std::string& name) const {
    if (!file_.exists(name)) fail("trajectories {}: missing dataset {}", path_, name);
    return file_.open_dataset(name);
  }

  at::Tensor whole(const std::string& name, c10::ScalarType dtype, int64_t rank) const {
    h5::Dataset d = dataset(name);
    check_dtype(d, name, dtype);
    if (static_cast<int64_t>(d.shape().size()) != rank)
      fail("trajectories {}: {} has shape {}, expected {} dimension(s)", path_, name, shape_text(d.shape()), rank);
    return d.read();
  }

  // Rows of a per-sample dataset whose trailing dims must equal `trailing`.
  at::Tensor rows(const std::string& name, c10::ScalarType dtype, const std::vector<int64_t>& trailing,
                  int64_t total_rows) const {
    h5::Dataset d = dataset(name);
    check_dtype(d, name, dtype);
    std::vector<hsize_t> want{static_cast<hsize_t>(total_rows)};
    for (int64_t t : trailing) want.push_back(static_cast<hsize_t>(t));
    if (d.shape() != want)
      fail("trajectories {}: {} has shape {}, expected {}", path_, name, shape_text(d.shape()), shape_text(want));
    return d.read_rows(first_, count_);
  }

  const h5::File& file() const { return file_; }
  const std::string& path() const { return path_; }

 private:
  void check_dtype(const h5::Dataset& d, const std::string& name, c10::ScalarType dtype) const {
    if (d.dtype() != dtype)
      fail("trajectories {}: {} is {}, expected {}", path_, name, precision::dtype_name(d.dtype()),
           precision::dtype_name(dtype));
  }

  h5::File file_;
  std::string path_;
  int64_t first_, count_;
};

void write_datasets(h5::File& file, const TrajectoryRecord& local, int64_t first_row, int64_t total_rows) {
  const Trajectories& t = local.trajectories;
  write_whole(file, "timesteps", t.snapshot->timesteps);
  write_whole(file, "sigmas", t.snapshot->sigmas);
  write_whole(file, "sde_steps", at::tensor(t.steps.sde_steps, at::kLong));
  write_whole(file, "latent_steps", at::tensor(t.steps.return_latents, at::kLong));
  write_rows(file, "latents", t.latents, first_row, total_rows);
  write_rows(file, "log_probs", t.log_probs, first_row, total_rows);
  write_rows(file, "final_latents", t.final_latents, first_row, total_rows);
  if (t.model_outputs.defined()) write_rows(file, "model_outputs", t.model_outputs, first_row, total_rows);
  if (t.rewards.defined()) write_rows(file, "rewards", t.rewards, first_row, total_rows);
  if (t.reward_values.defined()) {
    write_rows(file, "reward_values", t.reward_values, first_row, total_rows);
    file.set_attr("reward_names", fmt::format("{}", fmt::join(local.reward_names, ",")));
  }
  if (local.advantages.defined()) write_rows(file, "advantages", local.advantages.cpu(), first_row, total_rows);
  write_rows(file, "prompt_index", t.prompt_index, first_row, total_rows);
  write_rows(file, "sample_index", t.sample_index, first_row, total_rows);
  for (const auto& [name, tensor] : local.cond.tensors) write_rows(file, "cond/" + name, tensor, first_row, total_rows);
  for (const auto& [name, tensor] : local.negative.tensors)
    write_rows(file, "negative/" + name, tensor, first_row, total_rows);
  for (const auto& [key, value] : local.text_attrs) file.set_attr(key, value);
  for (const auto& [key, value] : local.number_attrs) file.set_attr(key, value);
}

}  // namespace

void write_trajectories(const std::string& path, const TrajectoryRecord& local, int64_t first_row, int64_t total_rows,
                        MPI_Comm comm) {
  // Written under a temporary name and renamed once every rank has closed
  // it: a failed write (which aborts the job) never leaves a file under the
  // final name for a trainer to read half of.
  const std::string tmp = path + ".tmp";
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);  // every rank: no barrier before the create
  {
    h5::File file = h5::File::create(tmp, comm);
    write_datasets(file, local, first_row, total_rows);
  }
  {
    dist::WaitScope waiting("io", "trajectory barrier (written)");
    MPI_Barrier(comm);
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail("trajectories {}: cannot rename {} to it: {}", path, tmp, ec.message());
  }
  dist::WaitScope waiting("io", "trajectory barrier (renamed)");
  MPI_Barrier(comm);
}

TrajectoryRecord read_trajectories(const std::string& path, int64_t first_row, int64_t count,
                                   const TrajectoryExpectation& expect) {
  const Reader r(path, first_row, count);
  const int64_t n = expect.total_rows;
  TrajectoryRecord out;
  Trajectories& t = out.trajectories;

  diffusion::Schedule snapshot;
  snapshot.timesteps = r.whole("timesteps", at::kFloat, 1);
  snapshot.sigmas = r.whole("sigmas", at::kFloat, 1);
  snapshot.check("trajectories " + path);
  const int64_t steps = snapshot.steps();
  t.snapshot = std::make_shared<const diffusion::Schedule>(snapshot);

  t.steps.sde_steps = to_vector(r.whole("sde_steps", at::kLong, 1));
  if (r.has("latent_steps")) {
    t.steps.return_latents = to_vector(r.whole("latent_steps", at::kLong, 1));
  } else {
    for (int64_t i = 0; i <= steps; ++i) t.steps.return_latents.push_back(i);
  }
  for (int64_t s : t.steps.sde_steps) {
    if (s < 0 || s >= steps) fail("trajectories {}: /sde_steps entry {} is not a step index below {}", path, s, steps);
    for (int64_t needed : {s, s + 1})
      if (std::find(t.steps.return_latents.begin(), t.steps.return_latents.end(), needed) ==
          t.steps.return_latents.end())
        fail("trajectories {}: SDE step {} needs latent x_{} but /latent_steps does not hold it", path, s, needed);
  }

  const int64_t kept = static_cast<int64_t>(t.steps.return_latents.size());
  const int64_t sde = static_cast<int64_t>(t.steps.sde_steps.size());
  std::vector<int64_t> per_latent{kept};
  per_latent.insert(per_latent.end(), expect.latent_shape.begin(), expect.latent_shape.end());
  t.latents = r.rows("latents", at::kFloat, per_latent, n);
  t.log_probs = r.rows("log_probs", at::kFloat, {sde}, n);
  if (r.has("final_latents")) {
    t.final_latents = r.rows("final_latents", at::kFloat, expect.latent_shape, n);
  } else {
    if (t.steps.return_latents.back() != steps)
      fail("trajectories {}: no /final_latents and /latent_steps does not end with x_{}", path, steps);
    t.final_latents = t.latents.select(1, kept - 1).contiguous();
  }
  if (r.has("model_outputs")) {
    std::vector<int64_t> per_output{sde};
    per_output.insert(per_output.end(), expect.latent_shape.begin(), expect.latent_shape.end());
    t.model_outputs = r.rows("model_outputs", at::kFloat, per_output, n);
  }
  if (r.has("rewards")) t.rewards = r.rows("rewards", at::kFloat, {}, n);
  if (r.has("reward_values") && !expect.reward_names.empty()) {
    const std::string names = fmt::format("{}", fmt::join(expect.reward_names, ","));
    const std::string written =
        r.file().has_attr("reward_names") ? r.file().string_attr("reward_names") : std::string("(none)");
    if (written != names)
      fail("trajectories {}: /reward_values holds rewards {}, the deck's [[reward]] entries are {}", path, written,
           names);
    t.reward_values = r.rows("reward_values", at::kFloat, {static_cast<int64_t>(expect.reward_names.size())}, n);
  }
  t.prompt_index = r.rows("prompt_index", at::kLong, {}, n);
  t.sample_index = r.has("sample_index") ? r.rows("sample_index", at::kLong, {}, n)
                                         : at::arange(first_row, first_row + count, at::kLong);
  for (const models::CondSpec& spec : expect.cond) {
    out.cond.tensors[spec.name] = r.rows("cond/" + spec.name, spec.dtype, spec.shape, n);
    if (r.has("negative/" + spec.name))
      out.negative.tensors[spec.name] = r.rows("negative/" + spec.name, spec.dtype, spec.shape, n);
  }
  if (t.log_probs.numel() > 0 && !at::isfinite(t.log_probs).all().item<bool>())
    fail("trajectories {}: /log_probs holds non-finite values", path);
  return out;
}

Trajectories to_device(Trajectories t, c10::Device device) {
  for (at::Tensor* x : {&t.latents, &t.log_probs, &t.model_outputs, &t.final_latents})
    if (x->defined()) *x = x->to(device);
  return t;
}

}  // namespace ditrl::rollout
