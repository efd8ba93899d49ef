// app::keep_freed_host_memory: blocks the size of a step's activations come
// from the heap and stay there when freed, instead of being mmapped and
// unmapped (faulted in again) every step. Each Catch2 case runs in its own
// process under CTest, so the process-wide malloc settings do not leak.
#include <ditrl/app/host_malloc.hpp>

#include <catch2/catch.hpp>

#include "process.hpp"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Above glibc's starting mmap threshold (128 KiB), so a fresh process would
// mmap it; below the 32 MiB ditrl sets.
constexpr size_t kBlock = 16 << 20;

void clear_malloc_environment() {
  for (const char* name :
       {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"})
    unsetenv(name);
}

}  // namespace

TEST_CASE("host malloc: a 16 MiB block comes from the heap and stays there after free", "[malloc]") {
  clear_malloc_environment();
  REQUIRE(ditrl::app::keep_freed_host_memory());
  const struct mallinfo2 before = mallinfo2();
  char* volatile block = static_cast<char*>(std::malloc(kBlock));
  REQUIRE(block != nullptr);
  std::memset(block, 1, kBlock);
  const struct mallinfo2 held = mallinfo2();
  CHECK(held.hblkhd == before.hblkhd);  // not mmapped
  CHECK(held.arena >= before.arena + kBlock);
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  CHECK(after.arena == held.arena);  // the heap's top was not trimmed
  CHECK(after.fordblks >= kBlock);   // the block is free for the next step
}

TEST_CASE("host malloc: the user's GLIBC_TUNABLES or MALLOC_ variables win", "[malloc]") {
  clear_malloc_environment();
  setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1);
  CHECK_FALSE(ditrl::app::keep_freed_host_memory());
  clear_malloc_environment();
  setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F", 1);  // not malloc's: ditrl's settings apply
  CHECK(ditrl::app::keep_freed_host_memory());
  clear_malloc_environment();
  setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  CHECK_FALSE(ditrl::app::keep_freed_host_memory());
}

TEST_CASE("host malloc: the test binaries run glibc's malloc / the ditrl binary runs tcmalloc when the build links it",
          "[malloc][cli]") {
  CHECK(ditrl::app::host_malloc_name().rfind("glibc ", 0) == 0);
  const auto version = ditrl::test::run_process(std::string(DITRL_BINARY) + " --version");
  REQUIRE(version.exit_code == 0);
  CHECK_THAT(version.output,
             Catch::Matchers::Contains(DITRL_TCMALLOC ? "malloc     tcmalloc (gperftools " : "malloc     glibc "));
}
