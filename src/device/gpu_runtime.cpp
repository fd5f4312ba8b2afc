// The process's one GPU runtime: simulated GPUs when MIRRORED_SIMULATED_GPUS asks for them, else
// the platform's.
#include "device/gpu/gpu_runtime.hpp"

#include <cstdlib>

#include "device/simulated/sim_runtime.hpp"

namespace mirrored::detail {
namespace {

std::unique_ptr<GpuRuntime> make_gpu_runtime() {
  const char* simulated = std::getenv("MIRRORED_SIMULATED_GPUS");
  if (!simulated || !*simulated) return make_platform_gpu_runtime();
  return make_simulated_gpu_runtime(parse_simulated_gpu_count(simulated));
}

}  // namespace

GpuRuntime& gpu_runtime() {
  // Leaked on purpose: backends it made serve tensors that static objects may free at exit.
  static GpuRuntime* const runtime = make_gpu_runtime().release();
  return *runtime;
}

}  // namespace mirrored::detail
