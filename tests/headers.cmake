# Header self-containment: every public header compiles alone (twice, for its include guard), and
# <mirrored/cuda.hpp> stops a build without CUDA with an #error. Run as the ctests headers.*, which
# build targets excluded from `all`; skipped in sanitizer builds (same code, more time).
if(NOT MIRRORED_SANITIZE STREQUAL "")
  return()
endif()

file(GLOB_RECURSE _mirrored_public_headers CONFIGURE_DEPENDS
  RELATIVE "${PROJECT_SOURCE_DIR}/include" "${PROJECT_SOURCE_DIR}/include/mirrored/*.hpp")
list(APPEND _mirrored_public_headers mirrored/config.hpp)
if(NOT MIRRORED_HAVE_CUDA)
  list(REMOVE_ITEM _mirrored_public_headers mirrored/cuda.hpp)
endif()
if(NOT TARGET mirrored::dlpack)
  list(REMOVE_ITEM _mirrored_public_headers mirrored/dlpack.hpp)
endif()
set(_mirrored_header_tus "")
foreach(header IN LISTS _mirrored_public_headers)
  string(MAKE_C_IDENTIFIER "${header}" id)
  set(tu "${CMAKE_CURRENT_BINARY_DIR}/headers/${id}.cpp")
  file(CONFIGURE OUTPUT "${tu}" CONTENT "#include <${header}>\n#include <${header}>\n")
  list(APPEND _mirrored_header_tus "${tu}")
endforeach()
add_library(mirrored_header_check OBJECT EXCLUDE_FROM_ALL ${_mirrored_header_tus})
# One translation unit per header, whatever CMAKE_UNITY_BUILD says: that is what is being tested.
set_target_properties(mirrored_header_check PROPERTIES UNITY_BUILD OFF)
target_link_libraries(mirrored_header_check PRIVATE mirrored::eigen)
if(TARGET mirrored::dlpack)
  target_link_libraries(mirrored_header_check PRIVATE mirrored::dlpack)
endif()
if(MIRRORED_HAVE_CUDA)
  target_link_libraries(mirrored_header_check PRIVATE CUDA::cudart)
endif()
mirrored_set_warnings(mirrored_header_check)
target_compile_options(mirrored_header_check PRIVATE -Werror)
add_test(NAME headers.self_contained
  COMMAND "${CMAKE_COMMAND}" --build "${PROJECT_BINARY_DIR}" --target mirrored_header_check)
set_tests_properties(headers.self_contained PROPERTIES LABELS headers TIMEOUT 600 RUN_SERIAL TRUE)

# Without C++20 the first error says so (a project without CMake may build with -std=c++17).
set(tu "${CMAKE_CURRENT_BINARY_DIR}/headers/cxx17.cpp")
file(CONFIGURE OUTPUT "${tu}" CONTENT "#include <mirrored/mirrored.hpp>\n")
add_test(NAME headers.cxx17_is_refused
  COMMAND "${CMAKE_CXX_COMPILER}" -std=c++17 -fsyntax-only "-I${PROJECT_SOURCE_DIR}/include"
          "-I${PROJECT_BINARY_DIR}/include" "${tu}")
set_tests_properties(headers.cxx17_is_refused PROPERTIES LABELS headers
  PASS_REGULAR_EXPRESSION "mirrored needs C\\+\\+20")

if(NOT MIRRORED_HAVE_CUDA)
  set(tu "${CMAKE_CURRENT_BINARY_DIR}/headers/cuda_without_cuda.cpp")
  file(CONFIGURE OUTPUT "${tu}" CONTENT "#include <mirrored/cuda.hpp>\n")
  add_library(mirrored_cuda_header_without_cuda OBJECT EXCLUDE_FROM_ALL "${tu}")
  target_link_libraries(mirrored_cuda_header_without_cuda PRIVATE mirrored::mirrored)
  add_test(NAME headers.cuda_needs_a_cuda_build
    COMMAND "${CMAKE_COMMAND}" --build "${PROJECT_BINARY_DIR}" --target mirrored_cuda_header_without_cuda)
  # The build must fail, and with the header's own message (not a missing cuda_runtime.h).
  set_tests_properties(headers.cuda_needs_a_cuda_build PROPERTIES
    LABELS headers RUN_SERIAL TRUE
    PASS_REGULAR_EXPRESSION "mirrored/cuda.hpp needs a CUDA build of mirrored")
endif()

# Compile-time mistakes get a static_assert naming the mistake: each file under compile_fail/ must
# fail to compile, with its message.
set(_compile_fail_cases run_tuple_as_two_parameters grads_and_vars_in_the_wrong_order
                        grads_and_vars_of_another_dtype)
set(_compile_fail_messages "Strategy::run: fn cannot be called with the arguments as each replica sees them"
                           "apply_gradients takes GradsAndVars<T>" "apply_gradients takes GradsAndVars<T>")
foreach(name message IN ZIP_LISTS _compile_fail_cases _compile_fail_messages)
  add_test(NAME headers.compile_fail.${name}
    COMMAND "${CMAKE_CXX_COMPILER}" -std=c++20 -fsyntax-only "-I${PROJECT_SOURCE_DIR}/include"
            "-I${PROJECT_BINARY_DIR}/include" "${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/${name}.cpp")
  set_tests_properties(headers.compile_fail.${name} PROPERTIES LABELS headers PASS_REGULAR_EXPRESSION "${message}")
endforeach()
