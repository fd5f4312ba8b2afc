// The GPU platform's facts, forwarded to the process's GPU runtime.
#include "device/gpu_platform.hpp"

#include "device/gpu/gpu_runtime.hpp"

namespace mirrored::detail {

const char* gpu_platform_name() { return gpu_runtime().name(); }

int physical_gpu_count() { return gpu_runtime().physical_gpu_count(); }

std::string gpu_unavailable_reason() { return gpu_runtime().unavailable_reason(); }

bool gpus_are_physical() { return gpu_runtime().drives_physical_gpus(); }

void enter_gpu(const Device& gpu) { gpu_runtime().enter_device(gpu); }

}  // namespace mirrored::detail
