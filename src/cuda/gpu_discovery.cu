// Physical GPU discovery through the CUDA runtime. Any runtime error (no driver, no device,
// insufficient driver) means zero GPUs: discovery never throws.
#include <cuda_runtime.h>

#include <string>

#include "../gpu_registry.hpp"

namespace mirrored::detail {

void register_cuda_part();  // cuda_backend.cpp: the backend factory and the core's GPU hooks

namespace {
struct Discovery {
  int count = 0;
  std::string reason;
  Discovery() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      reason = std::string("the CUDA runtime reports ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
      (void)cudaGetLastError();  // clear the sticky error so later calls start clean
      return;
    }
    count = n;
    if (n == 0) reason = "the CUDA runtime reports no devices";
    else register_cuda_part();  // only when there is a GPU to serve
  }
};
const Discovery& discovery() {
  static const Discovery d;
  return d;
}
}  // namespace

int physical_gpu_count() noexcept {
  try {
    return discovery().count;
  } catch (...) {
    return 0;
  }
}

std::string gpu_unavailable_reason() {
  const auto& d = discovery();
  return d.reason.empty() ? std::to_string(d.count) + " visible" : d.reason;
}
}  // namespace mirrored::detail
