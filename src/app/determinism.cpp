#include <ditrl/app/determinism.hpp>
#include <ditrl/app/stop_signal.hpp>
#include <ditrl/error.hpp>

#include <ATen/Context.h>
#include <ATen/Version.h>
#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace ditrl::app {

namespace {

constexpr const char* kMarker = "DITRL_KERNELS_PINNED";

std::vector<std::pair<std::string, std::string>> pins(int threads) {
  const std::string n = std::to_string(threads);
  return {{"ATEN_CPU_CAPABILITY", "avx2"},
          {"MKL_CBWR", "AVX2,STRICT"},
          {"OMP_NUM_THREADS", n},
          {"MKL_NUM_THREADS", n},
          {"CUBLAS_WORKSPACE_CONFIG", ":4096:8"}};
}

// This process's own argv, from /proc (CLI11 has consumed main's copy).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t begin = 0; begin < all.size();) {
    const size_t end = all.find('\0', begin);
    args.push_back(all.substr(begin, end - begin));
    begin = end == std::string::npos ? all.size() : end + 1;
  }
  return args;
}

}  // namespace

void pin_cpu_kernels(int threads) {
  if (std::getenv(kMarker)) return;
  for (const auto& [name, value] : pins(threads)) setenv(name.c_str(), value.c_str(), /*overwrite=*/0);
  setenv(kMarker, "1", 1);
  std::vector<std::string> args = own_arguments();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The binary's real path, so the process keeps its name ("ditrl", not "exe").
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  // exec resets signal handlers but keeps the mask and pending signals: a
  // preemption signal recorded by this image, or one that arrives while the
  // new image loads, waits for the handlers the new image installs before
  // its static initializers (app/stop_signal.hpp), which unblock it.
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGUSR1);
  sigset_t before;
  sigprocmask(SIG_BLOCK, &stops, &before);
  keep_stop_signal_pending();
  execv(ec ? "/proc/self/exe" : self.c_str(), argv.data());
  sigprocmask(SIG_SETMASK, &before, nullptr);
  fail("deterministic mode: re-executing with pinned CPU kernels failed: {}", std::strerror(errno));
}

void pin_gpu_kernels() {
  at::Context& c = at::globalContext();
  c.setDeterministicAlgorithms(true, /*warn_only=*/false);
  // Deterministic algorithms also NaN-fill every new tensor (one more kernel per
  // allocation) to expose reads of memory never written. The GPU tests passed
  // with the fill, finite and bitwise repeatable, so no result reads such memory;
  // CPU runs never filled. (Deterministic mode makes the launch-bound quickstart
  // 2.2-2.4x slower per rollout on an H200 with the fill and without it alike.)
  c.setDeterministicFillUninitializedMemory(false);
  c.setDeterministicCuDNN(true);
  c.setBenchmarkCuDNN(false);
  c.setAllowTF32CuBLAS(false);
  c.setAllowTF32CuDNN(false);
  c.setAllowBF16ReductionCuBLAS(false);
  c.setAllowFP16ReductionCuBLAS(false);
}

void warn_on_weaker_pins() {
  const char* cbwr = std::getenv("MKL_CBWR");
  if (cbwr && !std::strstr(cbwr, "STRICT"))
    spdlog::warn(
        "deterministic mode: MKL_CBWR={} from the environment is kept, but without STRICT MKL's GEMMs may round "
        "differently with their operands' addresses, so rollout/train parity and rank invariance can fail on some "
        "CPUs (unset it, or add ,STRICT)",
        cbwr);
}

std::string cpu_kernel_pins() {
  std::string text;
  for (const auto& [name, unused] : pins(1)) {
    const char* value = std::getenv(name.c_str());
    text += fmt::format("{}{}={}", text.empty() ? "" : " ", name, value ? value : "(unset)");
  }
  // What ATen read from them at load: the proof the re-exec took effect.
  return text + "; ATen CPU capability " + at::get_cpu_capability();
}

}  // namespace ditrl::app
