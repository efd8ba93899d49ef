// Preloaded into the ranks by tests/faults/run.sh (signal_startup_early): a
// constructor that runs after the static initializers of the libraries
// ditrl links (LibTorch's included: a preloaded object is initialised after
// them, just before the executable's own) and before main. It appends a line
// to $DITRL_TEST_STALL_INIT.<pid>, so the test knows the rank is there, and
// stays there two seconds, so the test's signal lands before main.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((constructor)) static void stall_before_main(void) {
  const char* mark = getenv("DITRL_TEST_STALL_INIT");
  if (!mark) return;
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", mark, (int)getpid());
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    if (write(fd, "before main\n", 12) != 12) _exit(90);
    close(fd);
  }
  // A handled signal cuts nanosleep short: sleep the rest, so that the
  // stall is the same whether a handler is in place or not.
  struct timespec left = {2, 0};
  while (nanosleep(&left, &left) != 0) {
  }
}
