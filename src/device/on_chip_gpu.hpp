#pragma once
// Private: one logical GPU as the same-chip all-reduce (collectives/to_one_device/) drives it. Every
// GPU platform (CUDA, the simulated GPU) offers one fused kernel that reduces the buffers of
// several logical GPUs of one physical GPU, whose memory is one address space; the collective
// orders it with the backends' streams and events. This is all it needs of a platform.

#include <cstdint>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"

namespace mirrored::detail {

class GpuBackend;  // the platform's side, behind this view (device/gpu/)

/// A view of logical GPU `gpu`'s backend. Cheap to copy; the backend lives as long as the process.
class OnChipGpu {
 public:
  /// The backend of logical GPU `gpu`, which exists (made on first use, as the GPU runtime does).
  explicit OnChipGpu(const Device& gpu);

  /// The device backend: its stream, its events, its memory.
  DeviceBackend& backend() const noexcept;
  /// Replicas `all_reduce_fused` takes at most.
  int max_fused_replicas() const noexcept;
  /// On the calling thread's stream, one kernel: `s = ((in[0][i] + in[1][i]) + …)`, divided by
  /// `mean_divisor` when it is > 0, written to every `out[r][i]`, r < n. Every pointer is memory of
  /// this GPU's physical GPU (any of its logical GPUs); `n` <= max_fused_replicas().
  void all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                        int64_t mean_divisor) const;
  /// The events the same-chip all-reduce records on this GPU's stream: "this replica's inputs are
  /// ready", "every output is written" (made with the backend).
  DeviceEvent& ready_event() const;
  DeviceEvent& done_event() const;

 private:
  GpuBackend* gpu_;
};

}  // namespace mirrored::detail
