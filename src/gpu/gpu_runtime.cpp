// The process's one GPU runtime.
#include "gpu/gpu_runtime.hpp"

namespace mirrored::detail {

GpuRuntime& gpu_runtime() {
  // Leaked on purpose: backends it made serve tensors that static objects may free at exit.
  static GpuRuntime* const runtime = make_platform_gpu_runtime().release();
  return *runtime;
}

}  // namespace mirrored::detail
