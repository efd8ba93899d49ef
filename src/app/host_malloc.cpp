#include <ditrl/app/host_malloc.hpp>

#include <dlfcn.h>
#include <fmt/format.h>
#include <gnu/libc-version.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace ditrl::app {

namespace {

// The thresholds glibc's own dynamic adjustment ends at once a process has
// freed a 32 MiB block, set from the start: blocks up to 32 MiB come from the
// heap, and up to 64 MiB of free heap top is kept for the next step. Larger
// blocks (attention probabilities, weights, staging buffers) stay mmapped
// and go back on free, so the peak grows by at most the kept 64 MiB.
constexpr int kMmapThreshold = 32 << 20;
constexpr int kTrimThreshold = 64 << 20;

bool user_sets_malloc() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return true;
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    if (std::getenv(name)) return true;
  return false;
}

// gperftools' own version call; present exactly when tcmalloc is loaded
// (linked into the executable, so ahead of glibc's malloc).
using TcVersion = const char* (*)(int*, int*, const char**);

TcVersion tcmalloc_version() {
  return reinterpret_cast<TcVersion>(dlsym(RTLD_DEFAULT, "tc_version"));
}

}  // namespace

bool tcmalloc_in_use() {
  return tcmalloc_version() != nullptr;
}

std::string host_malloc_name() {
  if (const TcVersion version = tcmalloc_version())
    return fmt::format("tcmalloc ({})", version(nullptr, nullptr, nullptr));
  return fmt::format("glibc {}", gnu_get_libc_version());
}

bool keep_freed_host_memory() {
  if (tcmalloc_in_use() || user_sets_malloc()) return false;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
}

}  // namespace ditrl::app
