# Consumer tests: a downstream project builds against mirrored by find_package (with and without
# Eigen on its machine), add_subdirectory and FetchContent. Skipped in sanitizer builds.
if(NOT MIRRORED_SANITIZE STREQUAL "")
  return()
endif()
set(_mirrored_consumer_modes add_subdirectory fetchcontent)
if(MIRRORED_INSTALL)
  list(PREPEND _mirrored_consumer_modes find_package find_package_without_eigen pkg_config)
endif()
if(MIRRORED_HAVE_CUDA AND DEFINED CUDAToolkit_BIN_DIR)
  get_filename_component(_mirrored_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
else()
  set(_mirrored_cuda_root "")
endif()
foreach(mode IN LISTS _mirrored_consumer_modes)
  add_test(NAME consumer.${mode}
    COMMAND ${CMAKE_COMMAND}
      -DMODE=${mode}
      -DCONSUMER_SOURCE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/consumer
      -DWORK_DIR=${PROJECT_BINARY_DIR}/consumer/${mode}
      -DMIRRORED_SOURCE_DIR=${PROJECT_SOURCE_DIR}
      -DMIRRORED_BINARY_DIR=${PROJECT_BINARY_DIR}
      -DCONFIG=$<CONFIG>
      -DGENERATOR=${CMAKE_GENERATOR}
      -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DEigen3_DIR=${Eigen3_DIR}
      -DCUDA_ROOT=${_mirrored_cuda_root}
      -DUNITY_BUILD=${CMAKE_UNITY_BUILD}
      -P ${PROJECT_SOURCE_DIR}/cmake/run_consumer.cmake)
  # Each mode has its own WORK_DIR, but every one runs a full nested configure and build: alone,
  # so that they do not starve timing-sensitive unit tests under `ctest -j`.
  # The embedded modes build the library again (without CUDA: AUTO is OFF when embedded); the
  # debug stage of CI runs them, the CUDA stage only the installed-package modes (its label filter).
  if(mode MATCHES "^(add_subdirectory|fetchcontent)$")
    set(_mirrored_consumer_labels "consumer;consumer_embedded")
  else()
    set(_mirrored_consumer_labels consumer)
  endif()
  set_tests_properties(consumer.${mode} PROPERTIES LABELS "${_mirrored_consumer_labels}" TIMEOUT 900 RUN_SERIAL TRUE)
endforeach()
