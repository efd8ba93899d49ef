#pragma once

// The collective watchdog: no rank waits forever for a peer.
//
// Every blocking collective (any backend, HDF5 collective I/O, raw MPI calls)
// runs inside a WaitScope naming its channel (the communicator or file) and
// operation. A process-wide Watchdog thread looks at this rank's open scopes;
// when one has been open longer than its limit ([parallel]
// startup_timeout_s before mark_started(), collective_timeout_s after), it
// asks every other rank's watchdog thread for its state over a side channel
// of its own (a duplicated world communicator, point-to-point, never the
// stuck collective), logs the operation and the ranks that are missing (not
// answering: stopped, hung or dead; or not yet arrived at that collective,
// with what they are doing instead) and ends the job with MPI_Abort.
//
// Without a Watchdog (single process, tools, tests) a WaitScope costs one
// atomic load.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ditrl::dist {

struct WatchdogOptions {
  double startup_timeout_s = 300;     // scopes opened before mark_started()
  double collective_timeout_s = 100;  // scopes opened after
  double poll_s = 0.25;               // how often the thread looks (and answers peers)
  double reply_wait_s = 5;            // how long a timed-out rank waits for peers' states
  int exit_code = 124;                // MPI_Abort's code: "timed out"
};

class Watchdog {
 public:
  // Collective over `world` (it duplicates it for the side channel). One
  // Watchdog per process at a time; none is started on a single rank.
  Watchdog(MPI_Comm world, const WatchdogOptions& options);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Start-up (MPI bring-up, model load) is over: scopes opened from now on
  // get collective_timeout_s.
  static void mark_started();
  // True while a Watchdog runs in this process.
  static bool running();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Where the watchdog cannot help, a deadline: before MPI is up (no side
// channel, no peer to ask) and once the watchdog is gone (MPI_Finalize, which
// waits for every peer). A process whose deadline passes before disarm()
// prints "ditrl: <message>" and exits with code 124; the launcher ends the rest.
class ExitDeadline {
 public:
  ExitDeadline(double seconds, std::string message);
  ~ExitDeadline();  // disarms it
  ExitDeadline(const ExitDeadline&) = delete;
  ExitDeadline& operator=(const ExitDeadline&) = delete;
  void disarm();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Marks the calling thread as waiting in collective `op` on `channel` (e.g.
// "host", "data", "io:step-000010.h5") until destroyed. Each channel's scopes
// are numbered in order, the same on every rank, so a timed-out rank can tell
// which peers have not reached its collective.
class WaitScope {
 public:
  // active = false: not a collective this time (a serial file, one rank).
  WaitScope(const std::string& channel, const std::string& op, bool active = true);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  uint64_t id_ = 0;  // 0: not registered (no watchdog)
};

}  // namespace ditrl::dist
