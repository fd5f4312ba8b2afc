#pragma once
/// \file
/// Optional CUDA interop for users who write their own kernels. The only public header that
/// includes CUDA's; include it explicitly (the umbrella header does not) and only in a CUDA build
/// of mirrored (`MIRRORED_HAVE_CUDA` in <mirrored/config.hpp>, `mirrored_HAVE_CUDA` in its CMake
/// package): elsewhere it stops the build with an #error.
///
/// Every GPU device has one stream on which the library orders all its work there (copies,
/// element-wise kernels, reductions, NCCL collectives). Enqueue your kernels on the same stream
/// and they are ordered with the library's work on that device's tensors, without extra
/// synchronisation:
///
///     strategy.run([](const Tensor<float>& x) {
///       Tensor<float> y = Tensor<float>::empty(x.shape(), x.device());
///       my_kernel<<<blocks, threads, 0, mirrored::cuda::current_stream()>>>(x.data(), y.data(), x.numel());
///       return get_replica_context()->all_reduce(ReduceOp::SUM, y);
///     }, xs);
///
/// Inside `Strategy::run` a GPU replica's device is already the thread's current CUDA device.

#include "mirrored/config.hpp"

#if !MIRRORED_HAVE_CUDA
#error "mirrored/cuda.hpp needs a CUDA build of mirrored; this one was configured without CUDA (MIRRORED_ENABLE_CUDA)"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "mirrored/device.hpp"

namespace mirrored::cuda {

/// The (compute) stream of a GPU device. \throws InvalidArgumentError for a CPU device; NotFoundError for a
/// GPU that is not visible; FailedPreconditionError when the process runs on simulated GPUs
/// (`MIRRORED_SIMULATED_GPUS`), which are not CUDA devices.
cudaStream_t stream(const Device& device);

/// The calling replica's stream inside `Strategy::run` on a GPU replica. \throws
/// FailedPreconditionError outside `run` or on a CPU replica.
cudaStream_t current_stream();

/// The CUDA device ordinal (physical GPU) behind a GPU device, which may be one of several logical
/// GPUs on that chip (`config::set_logical_gpu_devices`). \throws as `stream`.
int physical_device(const Device& device);

/// Statistics of a GPU device's caching allocator.
struct AllocatorStats {
  unsigned long long allocations = 0;         ///< tensor allocations
  unsigned long long cache_hits = 0;          ///< served from the cache
  unsigned long long device_allocations = 0;  ///< cudaMalloc calls that succeeded
  std::size_t bytes_in_use = 0;
  std::size_t bytes_cached = 0;
  std::size_t peak_bytes_in_use = 0;
};
/// The statistics of `device`'s allocator. \throws as `stream`.
AllocatorStats allocator_stats(const Device& device);
/// Returns `device`'s cached (unused) blocks to the driver (cudaFree).
void empty_cache(const Device& device);

}  // namespace mirrored::cuda
