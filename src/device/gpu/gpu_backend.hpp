#pragma once
// Private: what every GPU platform's device backend gives the platform-independent GPU code (the
// same-chip all-reduce, on_chip_all_reduce.hpp), naming where a GPU call ran, and the record of
// GPUs that a sticky error made unusable.

#include <cstdint>
#include <string>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"

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
/// calling thread is inside a strategy's run, as the registered replica-id source says).
std::string describe_gpu_call_site(const Device& logical, int physical);
/// The same for a call made by replica `replica` (-1: none), as kept with what a kernel found.
std::string describe_gpu_call_site(const Device& logical, int physical, int replica);

/// The calling thread's replica id in its sync group, or -1 outside a replica.
using ReplicaIdSource = int (*)() noexcept;
/// Registers what `describe_gpu_call_site` asks for the replica: the runtime, which owns the
/// replica contexts, does this once (this layer reads no runtime state). Until then, and with
/// nullptr, messages name no replica.
void set_replica_id_source(ReplicaIdSource source) noexcept;

/// The replica the calling thread works for: the innermost ActingReplicaScope's, else the
/// registered source's answer; -1 outside any replica. A GPU backend keeps it with what a kernel
/// found (an integer division by zero), so that only that replica's synchronize raises it.
int calling_replica_id() noexcept;

/// While it lives, the calling thread (a thread of the library, such as an asynchronous
/// collective's lane) works for replica `replica` (its id in the sync group): messages name it and
/// the errors its kernels find are that replica's. Destroy it on the constructing thread.
class ActingReplicaScope {
 public:
  explicit ActingReplicaScope(int replica) noexcept;
  ~ActingReplicaScope();
  ActingReplicaScope(const ActingReplicaScope&) = delete;
  ActingReplicaScope& operator=(const ActingReplicaScope&) = delete;

 private:
  int outer_;
};

/// Records that physical GPU `physical` hit a sticky error described by `what` (its context is
/// corrupt until the device is reset: every later call would fail). The first reason is kept.
void mark_gpu_unusable(int physical, const std::string& what) noexcept;

/// \throws FailedPreconditionError naming `logical` (on `physical`) and the recorded error when
/// that GPU was marked unusable: the device must be reset (the process restarted) first.
void check_gpu_usable(const Device& logical, int physical);

}  // namespace mirrored::detail
