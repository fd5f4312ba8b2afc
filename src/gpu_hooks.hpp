#pragma once
// Private: the points where the CUDA part of the library (src/cuda/) plugs into the
// device-independent core. GPU discovery installs the hooks when it finds a GPU; in a build
// without CUDA, or on a machine without a GPU, none is installed and the core behaves as on CPUs.

#include <cstddef>

#include "mirrored/cross_device_ops.hpp"
#include "mirrored/device.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

struct GpuHooks {
  /// Makes a GPU device current on the calling thread (cudaSetDevice of its physical GPU).
  void (*enter_device)(const Device& device) = nullptr;
  /// Copies `bytes` between two GPU devices without host staging (same-chip or peer copy).
  /// Complete on return.
  void (*copy_gpu_to_gpu)(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                          std::size_t bytes) = nullptr;
  /// `ReductionToOneDevice::all_reduce` when every GPU buffer of the step lives on one physical
  /// GPU: one kernel reads every replica's input and writes every replica's output. Returns false
  /// (having done nothing) when the step does not qualify; every replica decides alike.
  bool (*all_reduce_on_chip)(ReduceOp op, CollectiveStep& step) = nullptr;
};

/// Installs the hooks (once, from GPU discovery, before any GPU can be used).
void install_gpu_hooks(const GpuHooks& hooks) noexcept;

/// Called on a replica's thread at the start of every `run`: makes a GPU replica's device current
/// there, so that users' own kernels (mirrored/cuda.hpp) land on it. Nothing for host devices.
void enter_replica_device(const Device& device);

/// Copies between two GPU devices through the hook; false when none is installed.
bool copy_gpu_to_gpu(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                     std::size_t bytes);

/// See GpuHooks::all_reduce_on_chip; false when no hook is installed.
bool all_reduce_on_chip(ReduceOp op, CollectiveStep& step);

/// True when kernels of either device can address the other's memory directly: the same device,
/// two host devices, or two logical GPUs on one physical GPU.
bool same_memory(const Device& a, const Device& b);

}  // namespace mirrored::detail
