#pragma once
// Private: the process's GPU platform (CUDA, the simulated GPU, or none) as the layers above the
// device layer see it: its name, its GPUs, what it can do. They ask here rather than the GPU
// runtime of device/gpu/, which is the seam the platforms implement.

#include <string>

#include "mirrored/device.hpp"

namespace mirrored::detail {

/// The platform, for messages: "CUDA", "simulated", "none".
const char* gpu_platform_name();
/// Number of physical GPUs; 0 on any error of the platform.
int physical_gpu_count();
/// Why there are no GPUs ("built without CUDA", the platform's error, …), or how many there are.
std::string gpu_unavailable_reason();
/// True when the GPUs are physical devices of the platform, which its libraries (NCCL) can drive;
/// false for simulated GPUs and builds without GPUs.
bool gpus_are_physical();
/// Makes GPU `gpu` current on the calling thread (a replica thread, a collective's lane), so that
/// work issued on it outside the library (users' own kernels) lands on that GPU.
void enter_gpu(const Device& gpu);

// Each of these makes the GPU runtime on first use, and so \throws InvalidArgumentError when
// MIRRORED_SIMULATED_GPUS is set to anything but a whole number from 1 to 64.

}  // namespace mirrored::detail
