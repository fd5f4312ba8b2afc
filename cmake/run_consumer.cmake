# Builds and runs tests/consumer against mirrored in one of three ways.
#
#   cmake -DMODE=find_package|find_package_without_eigen|pkg_config|add_subdirectory|fetchcontent
#         -DCONSUMER_SOURCE_DIR=<mirrored>/tests/consumer
#         -DWORK_DIR=<scratch dir, distinct per mode>
#         -DMIRRORED_SOURCE_DIR=<mirrored source tree>
#         -DMIRRORED_BINARY_DIR=<mirrored build tree>   (find_package: installed from here)
#         [-DCONFIG=<build type>] [-DGENERATOR=<generator>] [-DMAKE_PROGRAM=<path>]
#         [-DCXX_COMPILER=<path>] [-DEigen3_DIR=<dir>] [-DCUDA_ROOT=<dir>]
#         -P run_consumer.cmake

foreach(var MODE CONSUMER_SOURCE_DIR WORK_DIR MIRRORED_SOURCE_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(find_package|find_package_without_eigen|pkg_config|add_subdirectory|fetchcontent)$")
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

function(run_step what)
  message(STATUS "[consumer.${MODE}] ${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[consumer.${MODE}] ${what} failed (${rc})")
  endif()
endfunction()

set(build_dir "${WORK_DIR}/build")
set(prefix_dir "${WORK_DIR}/prefix")

set(config_args "")
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "")
  set(config_args --config "${CONFIG}")
endif()

if(MODE STREQUAL "pkg_config")
  # A build without CMake: install, then compile the consumer with what pkg-config says.
  file(REMOVE_RECURSE "${prefix_dir}" "${build_dir}")
  file(MAKE_DIRECTORY "${build_dir}")
  run_step("install" "${CMAKE_COMMAND}" --install "${MIRRORED_BINARY_DIR}" --prefix "${prefix_dir}" ${config_args})
  file(GLOB_RECURSE pc_files "${prefix_dir}/*/mirrored.pc")
  if(NOT pc_files)
    message(FATAL_ERROR "[consumer.pkg_config] no mirrored.pc installed under ${prefix_dir}")
  endif()
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf REQUIRED)
  set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
  execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --cflags --libs --static mirrored
    OUTPUT_VARIABLE pc_flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[consumer.pkg_config] pkg-config mirrored failed (${rc})")
  endif()
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  foreach(name consumer newcomer)
    set(exe "${build_dir}/mirrored_${name}")
    if(name STREQUAL "consumer")
      set(source "${CONSUMER_SOURCE_DIR}/main.cpp")
    else()
      set(source "${CONSUMER_SOURCE_DIR}/newcomer.cpp")
    endif()
    run_step("compile mirrored_${name}" "${CXX_COMPILER}" "${source}" -o "${exe}" ${pc_flags})
    run_step("run mirrored_${name}" "${exe}")
  endforeach()
  message(STATUS "[consumer.pkg_config] OK")
  return()
endif()

set(consumer_mode "${MODE}")
set(consumer_eigen ON)
if(MODE STREQUAL "find_package_without_eigen")
  # A machine without Eigen: the package config must not need it, and mirrored::eigen is absent.
  set(consumer_mode find_package)
  set(consumer_eigen OFF)
endif()
set(configure_args
  -S "${CONSUMER_SOURCE_DIR}"
  -B "${build_dir}"
  "-DMIRRORED_CONSUMER_MODE=${consumer_mode}"
  "-DMIRRORED_CONSUMER_EIGEN=${consumer_eigen}")
if(DEFINED GENERATOR AND NOT GENERATOR STREQUAL "")
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(DEFINED MAKE_PROGRAM AND NOT MAKE_PROGRAM STREQUAL "")
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(DEFINED CXX_COMPILER AND NOT CXX_COMPILER STREQUAL "")
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(DEFINED CONFIG AND NOT CONFIG STREQUAL "")
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
# The embedded modes compile mirrored's sources again: as the enclosing build does (a unity build
# compiles them in a third of the time; the fuzz preset keeps the one file at a time build).
if(DEFINED UNITY_BUILD AND NOT UNITY_BUILD STREQUAL "")
  list(APPEND configure_args "-DCMAKE_UNITY_BUILD=${UNITY_BUILD}")
endif()
if(NOT consumer_eigen)
  list(APPEND configure_args -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=TRUE)
elseif(DEFINED Eigen3_DIR AND NOT Eigen3_DIR STREQUAL "" AND NOT Eigen3_DIR MATCHES "NOTFOUND$")
  list(APPEND configure_args "-DEigen3_DIR=${Eigen3_DIR}")
endif()

if(consumer_mode STREQUAL "find_package")
  if(NOT DEFINED MIRRORED_BINARY_DIR OR MIRRORED_BINARY_DIR STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: MODE=find_package needs -DMIRRORED_BINARY_DIR=...")
  endif()
  # Fresh prefix every time so stale headers/targets cannot hide problems.
  file(REMOVE_RECURSE "${prefix_dir}")
  run_step("install" "${CMAKE_COMMAND}" --install "${MIRRORED_BINARY_DIR}"
    --prefix "${prefix_dir}" ${config_args})
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix_dir}")
  if(DEFINED CUDA_ROOT AND NOT CUDA_ROOT STREQUAL "")
    list(APPEND configure_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  endif()
else()
  # MIRRORED_ENABLE_CUDA stays at its default (AUTO), which must mean OFF for an embedded mirrored
  # (the consumer checks MIRRORED_HAVE_CUDA); hand CMake the toolkit's nvcc so that AUTO could find it.
  list(APPEND configure_args "-DMIRRORED_SOURCE_DIR=${MIRRORED_SOURCE_DIR}" -DMIRRORED_CONSUMER_EMBEDDED=ON)
  find_program(_nvcc nvcc PATHS /usr/local/cuda/bin NO_DEFAULT_PATH)
  if(_nvcc)
    list(APPEND configure_args "-DCMAKE_CUDA_COMPILER=${_nvcc}")
  endif()
endif()

run_step("configure" "${CMAKE_COMMAND}" ${configure_args})
run_step("build" "${CMAKE_COMMAND}" --build "${build_dir}" ${config_args})

# mirrored_consumer checks the package; mirrored_newcomer trains, saves and restores as a user would.
foreach(name mirrored_consumer mirrored_newcomer)
  set(exe "${build_dir}/bin/${name}")
  if(NOT EXISTS "${exe}")
    message(FATAL_ERROR "[consumer.${MODE}] consumer executable not found: ${exe}")
  endif()
  run_step("run ${name}" "${exe}")
endforeach()
message(STATUS "[consumer.${MODE}] OK")
