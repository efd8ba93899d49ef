// Options of the ASan/UBSan test binary (ditrl_sanitized_tests), compiled in
// so that every run of it, CTest's test discovery included, uses them.
// Any finding ends the run with a non-zero exit: the test fails. No
// suppressions: the suite runs clean, leaks included.

extern "C" const char* __asan_default_options() {
  return "detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1";
}

extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }
