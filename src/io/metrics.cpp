#include <ditrl/build_info.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/io/metrics.hpp>
#include <ditrl/precision/cpu_fp32_gemm.hpp>
#include <ditrl/precision/cpu_half_gemm.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

namespace ditrl::io {

namespace {

constexpr const char* kRoot = "/metrics";

// Names of every dataset below /metrics, relative to it ("train/loss").
void collect_series(const h5::Group& group, const std::string& prefix, std::vector<std::string>& out) {
  for (const std::string& child : group.children()) {
    const std::string name = prefix.empty() ? child : prefix + "/" + child;
    if (H5Oexists_by_name(group.id(), child.c_str(), H5P_DEFAULT) <= 0) continue;
    H5O_info_t info;
    H5Oget_info_by_name(group.id(), child.c_str(), &info, H5P_DEFAULT);
    if (info.type == H5O_TYPE_GROUP)
      collect_series(group.open_group(child), name, out);
    else if (name != "step")
      out.push_back(name);
  }
}

void resize(h5::File& file, const std::string& name, int64_t rows) {
  h5::Dataset d = file.open_dataset(std::string(kRoot) + "/" + name);
  d.extend(static_cast<hsize_t>(rows));
}

// A damaged metrics file must not block training: it is kept for the user
// under a name of its own and the run starts a new one.
std::string move_aside(const std::string& path) {
  std::string aside = path + ".damaged";
  for (int i = 1; std::filesystem::exists(aside); ++i) aside = fmt::format("{}.damaged-{}", path, i);
  std::filesystem::rename(path, aside);
  return aside;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const std::string& deck_text, const std::string& device,
                             bool resume, int64_t first_step)
    : path_(path) {
  if (resume && std::filesystem::exists(path)) {
    try {
      reopen(first_step);
      return;
    } catch (const ditrl::Error& e) {
      rows_ = 0;
      known_.clear();
      spdlog::warn(
          "metrics file {} is damaged ({}); moved it to {} and starting a new one with the rows from "
          "optimizer step {} on",
          path, e.what(), move_aside(path), first_step);
    }
  } else if (resume) {
    spdlog::warn("metrics file {} is missing; a new one holds the rows from optimizer step {} on", path, first_step);
  }
  h5::File file = h5::File::create(path);
  h5::Group root = file.create_group(kRoot);
  h5::DatasetOptions options;
  options.chunk = {256};
  options.max_dims = {H5S_UNLIMITED};
  root.create_dataset("step", at::kLong, {0}, options);
  file.set_attr("deck", deck_text);
  file.set_attr("ditrl_version", build::kVersion);
  file.set_attr("ditrl_commit", build::git_commit());
  file.set_attr("cpu", cpu_kernel_identity());
  file.set_attr("device", device);
}

void MetricsWriter::reopen(int64_t first_step) {
  h5::File file = h5::File::open(path_, h5::File::Mode::ReadWrite);
  if (!file.exists("/metrics/step")) fail("{}: not a ditrl metrics file (no /metrics/step)", path_);
  const at::Tensor steps = file.open_dataset("/metrics/step").read();
  const int64_t* s = steps.data_ptr<int64_t>();
  while (rows_ < steps.numel() && s[rows_] < first_step) ++rows_;
  collect_series(file.open_group(kRoot), "", known_);
  h5::Group root = file.open_group(kRoot);
  for (const std::string& name : known_)
    if (const int64_t n = h5::Series::open_or_create(root, name).size(); n < rows_)
      fail("{}: series {} has {} rows where /metrics/step has {} (written by two jobs at once?)", path_, name, n,
           steps.numel());
  resize(file, "step", rows_);
  for (const std::string& name : known_) resize(file, name, rows_);
  file.close();
}

void MetricsWriter::write(int64_t step, const std::map<std::string, double>& values) {
  h5::File file = h5::File::open(path_, h5::File::Mode::ReadWrite);
  h5::Group root = file.open_group(kRoot);
  h5::Dataset steps = root.open_dataset("step");
  steps.extend(static_cast<hsize_t>(rows_ + 1));
  steps.write_rows(rows_, at::full({1}, step, at::kLong), false);

  // Every series is written at the row index, not appended: all of them stay
  // exactly as long as /metrics/step, whatever is in the file.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, value] : values) {
    h5::Series series = h5::Series::open_or_create(root, name);
    if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
      // A series that starts late is NaN for the rows before it.
      for (int64_t i = 0; i < rows_; ++i) series.set(i, nan);
      known_.push_back(name);
    }
    series.set(rows_, value);
  }
  for (const std::string& name : known_)
    if (!values.count(name)) h5::Series::open_or_create(root, name).set(rows_, nan);
  ++rows_;
}

namespace {

MetricsTable read_table(const h5::File& file, const std::string& path) {
  if (!file.exists("/metrics/step")) fail("{}: not a ditrl metrics file (no /metrics/step)", path);
  MetricsTable table;
  const at::Tensor steps = file.open_dataset("/metrics/step").read();
  table.steps.assign(steps.data_ptr<int64_t>(), steps.data_ptr<int64_t>() + steps.numel());
  std::vector<std::string> names;
  collect_series(file.open_group(kRoot), "", names);
  for (const std::string& name : names) {
    h5::Group root = file.open_group(kRoot);
    table.series[name] = h5::Series::open_or_create(root, name).read();
    if (table.series[name].size() != table.steps.size())
      fail("{}: series {} has {} rows where /metrics/step has {} (written by two jobs at once?)", path, name,
           table.series[name].size(), table.steps.size());
  }
  if (file.has_attr("cpu")) table.cpu = file.string_attr("cpu");
  return table;
}

struct FileStamp {
  std::uintmax_t size = 0;
  std::filesystem::file_time_type time;
  bool operator==(const FileStamp& o) const { return size == o.size && time == o.time; }
};

FileStamp stamp_of(const std::string& path) {
  return {std::filesystem::file_size(path), std::filesystem::last_write_time(path)};
}

// The file's bytes, read while no write changed its size or time; "" when a
// write came in between.
std::string stable_copy(const std::string& path) {
  const FileStamp before = stamp_of(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot be opened for reading", path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return stamp_of(path) == before ? bytes.str() : std::string();
}

}  // namespace

MetricsTable read_metrics(const std::string& path) {
  return read_table(h5::File::open(path), path);
}

MetricsTable read_metrics_while_written(const std::string& path, int tries, std::string* deck) {
  if (!std::filesystem::exists(path)) fail("{}: no such file", path);
  std::string last_error = "its size or time changed during every copy";
  for (int i = 0; i < tries; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    try {
      const std::string bytes = stable_copy(path);
      if (bytes.empty()) continue;
      const h5::File file = h5::File::open_image(path, bytes);
      MetricsTable table = read_table(file, path);
      if (deck) *deck = file.has_attr("deck") ? file.string_attr("deck") : "";
      return table;
    } catch (const std::exception& e) {  // HDF5's errors, or the file moved aside meanwhile
      last_error = e.what();
    }
  }
  fail("{}: no consistent copy in {} tries while it is written: {}", path, tries, last_error);
}

std::string cpu_kernel_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line) && (model == "unknown CPU" || flags.empty())) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name") model = value;
    if (key == "flags") flags = " " + value + " ";
  }
  std::string identity = model + ";";
  for (const char* isa :
       {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16"})
    if (flags.find(std::string(" ") + isa + " ") != std::string::npos) identity += std::string(" ") + isa;
  // MKL's reproducibility mode picks its kernels too (app/determinism.hpp).
  if (const char* cbwr = std::getenv("MKL_CBWR")) identity += std::string("; MKL_CBWR=") + cbwr;
  if (const char* max_isa = std::getenv("ONEDNN_MAX_CPU_ISA"))
    identity += std::string("; ONEDNN_MAX_CPU_ISA=") + max_isa;
  // Half-precision GEMMs other than this CPU's default ones are other kernels too.
  if (precision::cpu_half_gemm() != precision::parse_cpu_half_gemm("auto"))
    identity += "; cpu_half_gemm=" + precision::cpu_half_gemm_name(precision::cpu_half_gemm());
  // Every standard so far recorded LibTorch's BLAS; oneDNN's sums run in another order.
  if (precision::cpu_fp32_gemm() == precision::CpuFp32Gemm::Onednn) identity += "; cpu_fp32_gemm=onednn";
  return identity;
}

}  // namespace ditrl::io
