#include <ditrl/app/stop_signal.hpp>

#include <signal.h>

#include <atomic>

namespace ditrl::app {

namespace {

// Constant-initialised: valid before any static initializer has run.
std::atomic<int> recorded{0};

extern "C" void record_stop(int signal) {
  recorded.store(signal, std::memory_order_relaxed);
}

void set_action(int signal, void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  // Blocking calls resume after the handler, as they would without one
  // (MPI's and HDF5's reads and writes need not expect EINTR).
  action.sa_flags = SA_RESTART;
  sigaction(signal, &action, nullptr);
}

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

}  // namespace

void install_stop_handlers() {
  set_action(SIGTERM, record_stop);
  set_action(SIGUSR1, record_stop);
  const sigset_t stops = stop_set();
  sigprocmask(SIG_UNBLOCK, &stops, nullptr);
}

int stop_signal() {
  return recorded.load(std::memory_order_relaxed);
}

void restore_default_stop_actions() {
  set_action(SIGTERM, SIG_DFL);
  set_action(SIGUSR1, SIG_DFL);
  if (const int signal = stop_signal()) raise(signal);
}

void keep_stop_signal_pending() {
  if (const int signal = stop_signal()) raise(signal);
}

}  // namespace ditrl::app
