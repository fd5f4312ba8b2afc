# The CUDA build's library holds device code for every architecture of CMAKE_CUDA_ARCHITECTURES
# (a missing one is "no kernel image is available" on that GPU at run time).
#   cmake [-DCUOBJDUMP=<cuobjdump>] -DLIB=<libmirrored> -DARCHS="80;90" -P check_cuda_archs.cmake
# With cuobjdump: its list of embedded ELF images. Without it (some toolkits ship none): each
# embedded cubin carries the ptxas options it was built with ("-arch sm_90 -m 64").
if(CUOBJDUMP AND EXISTS "${CUOBJDUMP}")
  execute_process(COMMAND "${CUOBJDUMP}" --list-elf "${LIB}" OUTPUT_VARIABLE found RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cuobjdump --list-elf ${LIB} failed (${rc}): ${err}")
  endif()
  set(pattern "sm_@[^0-9]")
else()
  file(STRINGS "${LIB}" found REGEX "-arch sm_[0-9]+")
  set(pattern "-arch sm_@ ")
endif()
foreach(arch IN LISTS ARCHS)
  string(REGEX REPLACE "-(real|virtual)$" "" number "${arch}")
  string(REPLACE "@" "${number}" want "${pattern}")
  if(NOT found MATCHES "${want}")
    message(FATAL_ERROR "${LIB} has no device code for sm_${number} (CMAKE_CUDA_ARCHITECTURES=${ARCHS}); found:\n${found}")
  endif()
  message(STATUS "sm_${number}: present")
endforeach()
