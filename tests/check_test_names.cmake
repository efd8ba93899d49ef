# Fails the build when a test binary registers a case that cannot be selected
# by name: catch_discover_tests turns Catch's name list into a CMake list, so
# a ';' splits one case into CTest entries whose filters match nothing;
# Catch's command line splits a filter at ',' and takes '"' as quoting, so
# such a name matches nothing when given by name. (Every runner also gets
# `-w NoTests`, so a filter that matches nothing fails instead of passing.)
# Usage: cmake -DTEST_BINARY=<exe> -P check_test_names.cmake
execute_process(COMMAND "${TEST_BINARY}" --list-test-names-only
  OUTPUT_VARIABLE names RESULT_VARIABLE result)
# (Catch exits with the number of cases listed, so only a failure to run or
# an empty list is an error here.)
if(NOT result MATCHES "^[0-9]+$" OR NOT names)
  message(FATAL_ERROR "${TEST_BINARY} --list-test-names-only listed no test cases (exit ${result})")
endif()
# A ';' in the output is a name's own: hide it before making the lines a list.
string(REPLACE ";" "<semicolon>" names "${names}")
string(REPLACE "\n" ";" lines "${names}")
set(bad "")
foreach(line IN LISTS lines)
  if(line MATCHES "<semicolon>|[,\"]")
    string(REPLACE "<semicolon>" ";" line "${line}")
    string(APPEND bad "  ${line}\n")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "${TEST_BINARY}: test case names with ';' ',' or '\"' - CTest splits a name at ';', Catch's "
                      "test filter at ',' and unquotes '\"', so these could not be run by name; rename them:\n${bad}")
endif()
