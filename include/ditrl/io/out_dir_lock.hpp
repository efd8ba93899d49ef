#pragma once

// One job per run folder. Two `ditrl train` jobs writing one OUT interleave
// their metrics rows and overwrite each other's checkpoints, so a training
// job holds OUT for its whole life: rank 0 takes an exclusive flock on
// OUT/.lock and writes its host, PID and start time into it. A second job
// finds the lock held and every one of its ranks raises an error naming the
// holder, before it writes anything into OUT (logs included). The kernel
// drops the lock when the holder exits, however it exits, so a killed job
// leaves nothing to clean up. Where the file system has no flock (some
// Lustre and NFS mounts), the job warns and runs unlocked.

#include <ditrl/io/file_descriptor.hpp>

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ditrl::io {

// The job a lock file names: its first line is "host H, PID P, since T UTC".
// `ditrl status` reads it to tell a live job from a dead one.
struct LockHolder {
  std::string host;
  int64_t pid = 0;
};
std::optional<LockHolder> parse_lock_holder(const std::string& text);

// gethostname(), as the lock file records it.
std::string this_host();

class OutDirLock {
 public:
  // Collective over `comm`; creates `out_dir` if needed. Raises
  // dist::AgreedError on every rank when another job holds it.
  OutDirLock(const std::string& out_dir, MPI_Comm comm);

 private:
  FileDescriptor fd_{-1};
};

}  // namespace ditrl::io
