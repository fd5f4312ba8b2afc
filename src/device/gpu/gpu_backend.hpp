#pragma once
// Private: what every GPU platform's device backend gives the platform-independent GPU code (the
// same-chip all-reduce, on_chip_all_reduce.hpp), naming where a GPU call ran, and the record of
// GPUs that a sticky error made unusable.

#include <cstdint>
#include <string>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"
#include "util/calling_replica.hpp"

namespace mirrored::detail {

/// The backend of one logical GPU of a GPU platform (CUDA, or the simulated GPU).
class GpuBackend : public DeviceBackend {
 public:
  /// The physical GPU this logical GPU lives on.
  virtual int physical() const noexcept = 0;
  /// Replicas `all_reduce_fused` takes at most.
  virtual int max_fused_replicas() const noexcept = 0;
  /// On the calling thread's stream, one kernel: `s = ((in[0][i] + in[1][i]) + …)`, divided by
  /// `mean_divisor` when it is > 0, written to every `out[r][i]`, r < n. Every pointer is memory of
  /// this physical GPU (any of its logical GPUs); `n` <= max_fused_replicas().
  virtual void all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                                int64_t mean_divisor) = 0;
  /// The events the same-chip all-reduce records on this backend's stream: "this replica's inputs
  /// are ready", "every output is written" (made with the backend).
  virtual DeviceEvent& ready_event() = 0;
  virtual DeviceEvent& done_event() = 0;
};

/// "GPU:1 (physical GPU 0), replica 1": where a GPU call ran, for messages (the replica when the
/// calling thread works for one, as `calling_replica_id` says).
std::string describe_gpu_call_site(const Device& logical, int physical);
/// The same for a call made by replica `replica` (-1: none), as kept with what a kernel found.
std::string describe_gpu_call_site(const Device& logical, int physical, int replica);

/// Records that physical GPU `physical` hit a sticky error described by `what` (its context is
/// corrupt until the device is reset: every later call would fail). The first reason is kept.
void mark_gpu_unusable(int physical, const std::string& what) noexcept;

/// \throws FailedPreconditionError naming `logical` (on `physical`) and the recorded error when
/// that GPU was marked unusable: the device must be reset (the process restarted) first.
void check_gpu_usable(const Device& logical, int physical);

}  // namespace mirrored::detail
