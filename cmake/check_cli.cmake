# Runs a program with some arguments and checks its exit status, stdout and stderr: the command-line
# tests of the examples.
#
#   cmake -DEXE=<executable> "-DARGS=<arguments, shell-style>"
#         -DEXIT=<status>|nonzero
#         [-DSTDOUT=<regexes>] [-DSTDERR=<regexes>]   every regex must match ("@@" separates them)
#         [-DSTDOUT_NOT=<regexes>]                    no regex may match stdout
#         [-DSTDOUT_EMPTY=ON]                         nothing at all on stdout
#         -P check_cli.cmake
#
# MIRRORED_LOG_LEVEL=ERROR keeps log lines out of stderr.

cmake_policy(VERSION 3.25)  # quoted if() arguments are strings, not variable names

foreach(var EXE EXIT)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_cli.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${EXE}")
  message(FATAL_ERROR "check_cli.cmake: executable not found: ${EXE}")
endif()

set(ENV{MIRRORED_LOG_LEVEL} "ERROR")
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(
  COMMAND "${EXE}" ${args}
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  RESULT_VARIABLE rc)

set(problems "")
if(EXIT STREQUAL "nonzero")
  if(NOT rc MATCHES "^[0-9]+$" OR rc EQUAL 0)
    string(APPEND problems "exit status is '${rc}', expected a non-zero status\n")
  endif()
elseif(NOT rc STREQUAL "${EXIT}")
  string(APPEND problems "exit status is '${rc}', expected ${EXIT}\n")
endif()
if(STDOUT_EMPTY AND NOT out STREQUAL "")
  string(APPEND problems "stdout is not empty\n")
endif()
foreach(stream STDOUT STDERR)
  if(stream STREQUAL "STDOUT")
    set(text "${out}")
  else()
    set(text "${err}")
  endif()
  if(DEFINED ${stream} AND NOT "${${stream}}" STREQUAL "")
    string(REPLACE "@@" ";" regexes "${${stream}}")
    foreach(re IN LISTS regexes)
      if(NOT text MATCHES "${re}")
        string(APPEND problems "${stream} does not match '${re}'\n")
      endif()
    endforeach()
  endif()
endforeach()

if(DEFINED STDOUT_NOT AND NOT STDOUT_NOT STREQUAL "")
  string(REPLACE "@@" ";" regexes "${STDOUT_NOT}")
  foreach(re IN LISTS regexes)
    if(out MATCHES "${re}")
      string(APPEND problems "STDOUT matches '${re}', which it must not\n")
    endif()
  endforeach()
endif()

if(NOT problems STREQUAL "")
  message("---- ${EXE} ${ARGS} ----")
  message("---- stdout ----\n${out}")
  message("---- stderr ----\n${err}")
  message(FATAL_ERROR "${problems}")
endif()
