#pragma once
// Private: the one seam between the device-independent library and a GPU platform. Exactly one
// `GpuRuntime` serves the process, made on first use by `gpu_runtime()`: the simulated GPUs of
// src/device/simulated/ when `MIRRORED_SIMULATED_GPUS` is set (in every build; the platform's
// runtime is then never made), else the platform's, which CMake selects by source list
// (src/device/cuda/cuda_runtime.cpp in a CUDA build, src/device/gpu/no_gpu.cpp otherwise). The
// layers above ask it for GPU backends and for the few things that need the platform; without GPUs
// it reports none and they behave as on CPUs. It knows nothing of collectives: what they build
// from its backends (the same-chip all-reduce, NCCL) lives in src/collectives/.

#include <cstddef>
#include <memory>
#include <string>

#include "device/gpu/gpu_backend.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/device.hpp"

namespace mirrored::detail {

class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;

  /// The platform, for messages: "CUDA", "simulated", "none".
  virtual const char* name() const noexcept = 0;
  /// Number of physical GPUs; 0 on any error (never throws).
  virtual int physical_gpu_count() const noexcept = 0;
  /// Why there are no GPUs ("built without CUDA", the runtime's error, …), or how many there are.
  virtual std::string unavailable_reason() const = 0;

  /// The backend of logical GPU `device`, which exists (see logical_gpus.hpp). Made on first use;
  /// it lives as long as the process, so that static tensors can still free their memory.
  virtual GpuBackend& backend(const Device& device) = 0;
  /// True when the GPUs are physical devices of the platform, which its libraries (NCCL) can
  /// drive; false for simulated GPUs and builds without GPUs.
  virtual bool drives_physical_gpus() const noexcept = 0;
  /// Makes GPU `device` current on the calling thread (a replica thread, at the start of every
  /// `run`), so that users' own kernels land on it.
  virtual void enter_device(const Device& device) = 0;
  /// Copies `bytes` between two GPU devices without host staging (same-chip or peer copy).
  /// Complete on return. False, having done nothing, when the platform cannot.
  virtual bool copy_gpu_to_gpu(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                               std::size_t bytes) = 0;
};

/// The process's GPU runtime (made on first use; never destroyed). \throws InvalidArgumentError
/// when `MIRRORED_SIMULATED_GPUS` is set to anything but a whole number from 1 to 64.
GpuRuntime& gpu_runtime();

/// Makes the platform's runtime. Defined by exactly one source that CMake selects.
std::unique_ptr<GpuRuntime> make_platform_gpu_runtime();

}  // namespace mirrored::detail
