// Physical GPU discovery for builds without CUDA; the CUDA build replaces it with
// src/cuda/gpu_discovery.cu.
#ifndef MIRRORED_HAVE_CUDA
#include "gpu_registry.hpp"

namespace mirrored::detail {
int physical_gpu_count() noexcept { return 0; }
std::string gpu_unavailable_reason() { return "this build of mirrored has no CUDA support"; }
}  // namespace mirrored::detail
#endif
