# Install and export: the library, its public headers (include/mirrored and the generated
# config.hpp; never src/), and a package config that finds only what the installed targets need.
include(CMakePackageConfigHelpers)

set(MIRRORED_CONFIG_INSTALL_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/mirrored")

install(TARGETS mirrored
  EXPORT mirroredTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/mirrored" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES "${PROJECT_BINARY_DIR}/include/mirrored/config.hpp" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mirrored)
install(EXPORT mirroredTargets NAMESPACE mirrored:: DESTINATION ${MIRRORED_CONFIG_INSTALL_DIR})
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION ${CMAKE_INSTALL_DOCDIR})

# pkg-config, for builds without CMake. A static library lists what it links privately.
set(MIRRORED_PC_LIBS_PRIVATE "-pthread")
if(MIRRORED_HAVE_CUDA)
  string(APPEND MIRRORED_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(MIRRORED_HAVE_NCCL)
  string(APPEND MIRRORED_PC_LIBS_PRIVATE " -L${MIRRORED_NCCL_LIBRARY_DIR} -lnccl")
endif()
# Gloo (src/cluster/) and zlib (checkpoint checksums) are linked privately: a static library
# hands them on, each with the directory of the file CMake found for it (never a guessed one).
function(_mirrored_pc_library out target name)
  get_target_property(_location ${target} LOCATION)
  if(_location)
    get_filename_component(_dir "${_location}" DIRECTORY)
    set(${out} "-L${_dir} -l${name}" PARENT_SCOPE)
  else()
    set(${out} "-l${name}" PARENT_SCOPE)
  endif()
endfunction()
find_package(ZLIB REQUIRED)  # ZLIB::ZLIB of src/util/ is not visible in this directory
_mirrored_pc_library(_mirrored_pc_gloo gloo gloo)
_mirrored_pc_library(_mirrored_pc_zlib ZLIB::ZLIB z)
string(APPEND MIRRORED_PC_LIBS_PRIVATE " ${_mirrored_pc_gloo} ${_mirrored_pc_zlib}")
# Relocatable: the prefix is found from where the .pc file lies (`cmake --install --prefix` works).
file(RELATIVE_PATH MIRRORED_PC_PREFIX_FROM_PCDIR "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
configure_file("${PROJECT_SOURCE_DIR}/cmake/mirrored.pc.in" "${PROJECT_BINARY_DIR}/mirrored.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/mirrored.pc" DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# mirrored::eigen (only <mirrored/eigen.hpp> needs Eigen) in an export set of its own: the package
# config loads it when the consumer's machine has Eigen.
set(MIRRORED_CONFIG_HAS_EIGEN OFF)
if(TARGET mirrored_eigen)
  set(MIRRORED_CONFIG_HAS_EIGEN ON)
  install(TARGETS mirrored_eigen EXPORT mirroredEigenTargets)
  install(EXPORT mirroredEigenTargets NAMESPACE mirrored:: DESTINATION ${MIRRORED_CONFIG_INSTALL_DIR})
endif()

# mirrored::dlpack likewise (only <mirrored/dlpack.hpp> needs DLPack's header).
set(MIRRORED_CONFIG_HAS_DLPACK OFF)
if(TARGET mirrored_dlpack)
  set(MIRRORED_CONFIG_HAS_DLPACK ON)
  install(TARGETS mirrored_dlpack EXPORT mirroredDlpackTargets)
  install(EXPORT mirroredDlpackTargets NAMESPACE mirrored:: DESTINATION ${MIRRORED_CONFIG_INSTALL_DIR})
endif()

# The consumer of an installed *static* CUDA build must link cudart/NCCL.
get_target_property(_mirrored_type mirrored TYPE)
if(MIRRORED_HAVE_CUDA AND _mirrored_type STREQUAL "STATIC_LIBRARY")
  set(MIRRORED_CONFIG_NEEDS_CUDA ON)
else()
  set(MIRRORED_CONFIG_NEEDS_CUDA OFF)
endif()

# ... and Gloo (src/cluster/, linked privately), whose package defines the target `gloo`.
if(_mirrored_type STREQUAL "STATIC_LIBRARY")
  set(MIRRORED_CONFIG_NEEDS_GLOO ON)
else()
  set(MIRRORED_CONFIG_NEEDS_GLOO OFF)
endif()
# ... and zlib, which the library links privately.
if(_mirrored_type STREQUAL "STATIC_LIBRARY")
  set(MIRRORED_CONFIG_NEEDS_ZLIB ON)
else()
  set(MIRRORED_CONFIG_NEEDS_ZLIB OFF)
endif()

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/mirroredConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/mirroredConfig.cmake"
  INSTALL_DESTINATION ${MIRRORED_CONFIG_INSTALL_DIR})
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/mirroredConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  # 0.x: a minor version may break compatibility, so 0.1 satisfies only requests for 0.1.
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/mirroredConfig.cmake"
  "${PROJECT_BINARY_DIR}/mirroredConfigVersion.cmake"
  DESTINATION ${MIRRORED_CONFIG_INSTALL_DIR})
