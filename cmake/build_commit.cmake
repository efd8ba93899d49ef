# Run at every build (cmake -P, target ditrl_build_commit): writes OUT, a
# source defining ditrl::build::git_commit(), only when the commit changed,
# so `ditrl --version` names the commit the binary was built from and an
# unchanged commit recompiles nothing. A tree copied to a lent GPU machine
# names its commit in the DITRL_COMMIT variable, which wins: the copy's .git,
# if any, can be older than the tree (seen on the H200 machine, 2026-12-04).
if(DEFINED ENV{DITRL_COMMIT})
  set(commit "$ENV{DITRL_COMMIT}")
else()
  execute_process(
    COMMAND git rev-parse --short HEAD
    WORKING_DIRECTORY ${SOURCE_DIR}
    OUTPUT_VARIABLE commit
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT commit)
  set(commit "unknown")
endif()
set(text "// Generated at build time by cmake/build_commit.cmake; do not edit.
#include <ditrl/build_info.hpp>

const char* ditrl::build::git_commit() {
  return \"${commit}\";
}
")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
