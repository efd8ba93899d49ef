#pragma once

// Runs a shell command for tests that check a whole program: exit status,
// combined output and wall time.

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <sys/wait.h>

namespace ditrl::test {

struct ProcessResult {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

inline ProcessResult run_process(const std::string& command) {
  ProcessResult result;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// A fresh, empty directory under the build's test-output folder.
inline std::string fresh_output_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(DITRL_TEST_OUTPUT_DIR) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace ditrl::test
