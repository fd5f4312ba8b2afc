# The project's options, sanitizer flags and warning flags.

set(MIRRORED_ENABLE_CUDA "AUTO" CACHE STRING
  "Build the CUDA/NCCL backend: ON, OFF or AUTO (enable when a CUDA compiler is found)")
set_property(CACHE MIRRORED_ENABLE_CUDA PROPERTY STRINGS ON OFF AUTO)

option(MIRRORED_BUILD_TESTS "Build the mirrored unit tests" ${PROJECT_IS_TOP_LEVEL})
option(MIRRORED_BUILD_EXAMPLES "Build the mirrored examples (and their output tests)" ${PROJECT_IS_TOP_LEVEL})
option(MIRRORED_BUILD_BENCH "Build the mirrored benchmarks (needs google benchmark)" ${PROJECT_IS_TOP_LEVEL})
option(MIRRORED_INSTALL "Generate install/export rules for mirrored" ${PROJECT_IS_TOP_LEVEL})
option(MIRRORED_BUILD_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang and MIRRORED_SANITIZE=fuzzer)" OFF)

set(MIRRORED_SANITIZE "" CACHE STRING
  "Sanitizer build: empty, 'address' (ASan+UBSan), 'thread' (TSan) or 'fuzzer' (clang: libFuzzer coverage, ASan+UBSan)")
set_property(CACHE MIRRORED_SANITIZE PROPERTY STRINGS "" address thread fuzzer)

# Sanitizers are directory-wide, so that every target of this project gets them.
if(MIRRORED_SANITIZE STREQUAL "address")
  set(_mirrored_san_flags
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
elseif(MIRRORED_SANITIZE STREQUAL "thread")
  set(_mirrored_san_flags -fsanitize=thread)
elseif(MIRRORED_SANITIZE STREQUAL "fuzzer")
  # Everything is compiled with libFuzzer's coverage instrumentation (without its main); the fuzz
  # targets of tests/fuzz link libFuzzer itself (-fsanitize=fuzzer).
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MIRRORED_SANITIZE=fuzzer needs clang (the fuzz preset uses clang++-14)")
  endif()
  set(_mirrored_san_flags
    -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  set(_mirrored_san_link_flags -fsanitize=address,undefined)
elseif(NOT MIRRORED_SANITIZE STREQUAL "")
  message(FATAL_ERROR
    "MIRRORED_SANITIZE must be empty, 'address', 'thread' or 'fuzzer' (got '${MIRRORED_SANITIZE}')")
endif()
if(_mirrored_san_flags)
  if(NOT DEFINED _mirrored_san_link_flags)
    set(_mirrored_san_link_flags ${_mirrored_san_flags})
  endif()
  message(STATUS "mirrored: sanitizer build (${MIRRORED_SANITIZE}): ${_mirrored_san_flags}")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_mirrored_san_flags}>")
  add_link_options(${_mirrored_san_link_flags})
endif()

# Warnings for this project's own targets only (never usage requirements).
function(mirrored_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
endfunction()
