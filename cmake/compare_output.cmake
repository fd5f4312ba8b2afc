# Runs an example and compares its stdout byte-for-byte with an expected file.
#
#   cmake -DEXE=<executable> -DEXPECTED=<file.txt> [-DACTUAL=<file>] [-DUPDATE=ON]
#         -P compare_output.cmake
#
# stderr is ignored (only shown on failure); MIRRORED_LOG_LEVEL=ERROR is set
# so log lines stay quiet. With -DUPDATE=ON the expected file is rewritten
# from the actual output instead of being compared.

foreach(var EXE EXPECTED)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "compare_output.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${EXE}")
  message(FATAL_ERROR "compare_output.cmake: executable not found: ${EXE}")
endif()

set(ENV{MIRRORED_LOG_LEVEL} "ERROR")

execute_process(
  COMMAND "${EXE}"
  OUTPUT_VARIABLE actual
  ERROR_VARIABLE stderr_text
  RESULT_VARIABLE rc)

if(NOT rc EQUAL 0)
  message("---- stdout ----\n${actual}")
  message("---- stderr ----\n${stderr_text}")
  message(FATAL_ERROR "${EXE} exited with '${rc}'")
endif()

if(UPDATE)
  file(WRITE "${EXPECTED}" "${actual}")
  message(STATUS "Updated ${EXPECTED}")
  return()
endif()

if(NOT EXISTS "${EXPECTED}")
  message(FATAL_ERROR "compare_output.cmake: expected-output file not found: ${EXPECTED}")
endif()
file(READ "${EXPECTED}" expected)

if("${actual}" STREQUAL "${expected}")
  return()
endif()

# ---- mismatch: show a diff (or both outputs) and fail ----
if(NOT DEFINED ACTUAL OR ACTUAL STREQUAL "")
  get_filename_component(_name "${EXPECTED}" NAME_WE)
  set(ACTUAL "${CMAKE_CURRENT_BINARY_DIR}/${_name}.actual.txt")
endif()
file(WRITE "${ACTUAL}" "${actual}")

find_program(DIFF_EXECUTABLE diff)
if(DIFF_EXECUTABLE)
  execute_process(
    COMMAND "${DIFF_EXECUTABLE}" -u "${EXPECTED}" "${ACTUAL}"
    OUTPUT_VARIABLE diff_text)
  message("---- diff -u expected actual ----\n${diff_text}")
else()
  message("---- expected (${EXPECTED}) ----\n${expected}")
  message("---- actual (${ACTUAL}) ----\n${actual}")
endif()
if(NOT stderr_text STREQUAL "")
  message("---- stderr ----\n${stderr_text}")
endif()
message(FATAL_ERROR
  "stdout of ${EXE} differs from ${EXPECTED}\n"
  "Actual output saved to ${ACTUAL}.\n"
  "To accept it: cmake -DEXE=${EXE} -DEXPECTED=${EXPECTED} -DUPDATE=ON -P ${CMAKE_CURRENT_LIST_FILE}")
