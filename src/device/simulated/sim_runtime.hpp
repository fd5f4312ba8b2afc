#pragma once
// Private: the simulated GPU runtime. `MIRRORED_SIMULATED_GPUS=N` makes `gpu_runtime()` return it
// (in every build: the platform's runtime is then never made), so that "GPU:k" is a simulated GPU
// and every device-generic path (placement, ops selection, logical GPUs, prefetch to device, the
// same-chip all-reduce, packed collectives, streams and events) runs as on a GPU, in every CI run.
// See docs/gpu.md, "The simulated GPU".

#include <memory>
#include <string>

#include "device/gpu/gpu_runtime.hpp"

namespace mirrored::detail {

namespace sim {
class Backend;
}

/// The most simulated GPUs MIRRORED_SIMULATED_GPUS may ask for.
inline constexpr int kMaxSimulatedGpus = 64;

/// The number of simulated GPUs a value of MIRRORED_SIMULATED_GPUS asks for. \throws
/// InvalidArgumentError unless it is a whole number from 1 to kMaxSimulatedGpus.
int parse_simulated_gpu_count(const std::string& text);

/// A runtime of `n` simulated physical GPUs, configured from the environment
/// (MIRRORED_SIMULATED_GPU_SEED, _DELAY_US, _MEMORY_MB).
std::unique_ptr<GpuRuntime> make_simulated_gpu_runtime(int n);

/// The simulated backend of GPU `device` when the process runs on simulated GPUs, else nullptr
/// (for the simulator's own tests).
sim::Backend* simulated_backend(const Device& device);

}  // namespace mirrored::detail
