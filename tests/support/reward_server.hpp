#pragma once

// A reward server for the tests: a Python script started on 127.0.0.1 with
// `--port-file FILE` (the port the OS chose, written once it listens) plus
// the caller's arguments, and stopped when the object goes. Starting is
// bounded in time; so is stopping (SIGTERM, then SIGKILL). The faulty
// server (tests/fixtures/reward_server/faulty_server.py) and the reference
// server (tools/reward_server.py) both take --port-file.

#include <ditrl/error.hpp>

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "process.hpp"

namespace ditrl::test {

inline std::string faulty_reward_server_script() {
  return std::string(DITRL_FIXTURES_DIR) + "/reward_server/faulty_server.py";
}

class RewardServer {
 public:
  explicit RewardServer(const std::string& script, const std::vector<std::string>& args = {},
                        double start_timeout_s = 30) {
    static int started = 0;
    const std::string dir = fresh_output_dir(fmt::format("reward-server-{}-{}", getpid(), started++));
    const std::string port_file = dir + "/port";
    std::vector<std::string> argv{DITRL_PYTHON, script, "--port-file", port_file};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ < 0) fail("reward server: fork failed");
    if (pid_ == 0) {
      std::vector<char*> words;
      for (std::string& word : argv) words.push_back(word.data());
      words.push_back(nullptr);
      execvp(words[0], words.data());
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(start_timeout_s);
    while (!std::filesystem::exists(port_file)) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        fail("reward server {} exited before listening (status {})", script, status);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        stop();
        fail("reward server {} wrote no port within {} s", script, start_timeout_s);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream(port_file) >> port_;
  }
  ~RewardServer() { stop(); }
  RewardServer(const RewardServer&) = delete;
  RewardServer& operator=(const RewardServer&) = delete;

  int port() const { return port_; }
  // http://127.0.0.1:PORT followed by `path` ("/ok/case" for the faulty server's modes).
  std::string url(const std::string& path = "") const { return fmt::format("http://127.0.0.1:{}{}", port_, path); }

 private:
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 250; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return void(pid_ = -1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace ditrl::test
