# CUDA and NCCL detection. Sets MIRRORED_HAVE_CUDA and MIRRORED_HAVE_NCCL (ON/OFF); with CUDA,
# enables the CUDA language and finds CUDAToolkit; with NCCL, defines the imported target
# mirrored::nccl.

string(TOUPPER "${MIRRORED_ENABLE_CUDA}" _mirrored_cuda_req)
if(_mirrored_cuda_req MATCHES "^(ON|TRUE|YES|Y|1)$")
  set(_mirrored_cuda_req ON)
elseif(_mirrored_cuda_req MATCHES "^(OFF|FALSE|NO|N|0)$")
  set(_mirrored_cuda_req OFF)
elseif(NOT _mirrored_cuda_req STREQUAL "AUTO")
  message(FATAL_ERROR "MIRRORED_ENABLE_CUDA must be ON, OFF or AUTO (got '${MIRRORED_ENABLE_CUDA}')")
endif()

# AUTO in a project that embeds mirrored (add_subdirectory, FetchContent) means OFF: a CPU-only
# consumer must not link libcudart and NCCL just because nvcc is on PATH. It can set ON.
if(_mirrored_cuda_req STREQUAL "AUTO" AND NOT PROJECT_IS_TOP_LEVEL)
  set(_mirrored_cuda_req OFF)
endif()

set(MIRRORED_HAVE_CUDA OFF)
set(MIRRORED_HAVE_NCCL OFF)
if(NOT _mirrored_cuda_req STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MIRRORED_HAVE_CUDA ON)
  elseif(_mirrored_cuda_req STREQUAL "ON")
    message(FATAL_ERROR "MIRRORED_ENABLE_CUDA=ON but no CUDA compiler was found "
                        "(set CMAKE_CUDA_COMPILER or put nvcc on PATH)")
  else()
    message(STATUS "mirrored: no CUDA compiler found, building without the CUDA backend")
  endif()
endif()

if(NOT MIRRORED_HAVE_CUDA)
  return()
endif()

# CMake 3.25 predates CUDA 13: with the architecture unset it builds sm_75 only, and `native`
# needs a GPU at configure time. Ampere (A100, sm_80) and Hopper (H100/H200, sm_90) by default;
# set CMAKE_CUDA_ARCHITECTURES for anything else.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
endif()
# The library links CUDA::cudart (shared) explicitly; a static default runtime would link a
# second copy of cudart into it.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
# Do not set CMAKE_CUDA_STANDARD 20 before enable_language(): CMake 3.25 does not know that
# nvcc >= 12 supports C++20, and the compiler checks fail.
enable_language(CUDA)
# Backport of CMake >= 3.26's CUDA20 knowledge for nvcc >= 12.0 (otherwise CUDA sources, which
# inherit CXX_STANDARD 20, fail at generate time).
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
   AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
find_package(CUDAToolkit REQUIRED)

# MIRRORED_NCCL_ROOT (or NCCL_ROOT in the environment) points at an NCCL outside the toolkit,
# e.g. the nvidia-nccl wheel's folder, which ships only libnccl.so.2.
set(MIRRORED_NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL installation to prefer (include/, lib/)")
find_library(MIRRORED_NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${MIRRORED_NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}"
  PATH_SUFFIXES lib64 lib
  DOC "NCCL library used by the mirrored CUDA backend")
find_path(MIRRORED_NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${MIRRORED_NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} "${CUDAToolkit_LIBRARY_ROOT}/include"
  DOC "Directory containing nccl.h")
if(MIRRORED_NCCL_LIBRARY AND MIRRORED_NCCL_INCLUDE_DIR)
  set(MIRRORED_HAVE_NCCL ON)
  get_filename_component(MIRRORED_NCCL_LIBRARY_DIR "${MIRRORED_NCCL_LIBRARY}" DIRECTORY)
  if(NOT TARGET mirrored::nccl)
    add_library(mirrored::nccl UNKNOWN IMPORTED)
    set_target_properties(mirrored::nccl PROPERTIES
      IMPORTED_LOCATION "${MIRRORED_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${MIRRORED_NCCL_INCLUDE_DIR}")
  endif()
  message(STATUS "mirrored: CUDA backend enabled (arch ${CMAKE_CUDA_ARCHITECTURES}), NCCL: ${MIRRORED_NCCL_LIBRARY}")
else()
  message(WARNING "mirrored: CUDA enabled but NCCL was not found; building the CUDA backend without NCCL")
endif()
