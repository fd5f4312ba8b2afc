#pragma once
// Private: how the workers of a job move bytes between each other — the cross-worker half of
// every collective. Implementations: Gloo over TCP (gloo_transport.cpp) and POSIX shared memory
// for workers on one host (shm_transport.cpp). Operations are collective: every worker calls the
// same ones in the same order, from one thread at a time (an asynchronous layer may call them
// from a communication thread of its own, in issue order). Every operation ends by its deadline.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mirrored/dtype.hpp"

namespace mirrored::detail::cluster {

class WorkerTransport {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~WorkerTransport();

  /// "Gloo ring over TCP", "shared memory", … (for logs and messages).
  virtual std::string name() const = 0;

  /// `out[i] = sum over workers of in[i]` for `count` elements of `dtype` in host memory; `in` may
  /// equal `out`. Every worker passes the same dtype and count. float16 and bfloat16 are summed as
  /// `all_reduce_half` sums them (in float, in worker order, rounded once).
  virtual void all_reduce_sum(DType dtype, const void* in, void* out, int64_t count, Clock::time_point deadline) = 0;

  /// The sum of half-precision contributions (`CommunicationOptions::compression`, and the sum of
  /// float16 and bfloat16 tensors, where `dtype` == `half`): every worker's `in` (`count` elements
  /// of `dtype`: float32, float64 or `half`) is rounded to `half` (float16 or bfloat16) by the host
  /// backend's `cast`, and only those halves cross between workers; each element's halves are
  /// summed in float in worker order, that sum is rounded once to `half` and converted exactly to
  /// `dtype` into `out`. Every worker gets the same bits. `in` may equal `out`; every worker passes
  /// the same dtypes and count.
  virtual void all_reduce_half(DType dtype, DType half, const void* in, void* out, int64_t count,
                               Clock::time_point deadline) = 0;

  /// `out` = the concatenation, in rank order, of every worker's `in` (worker w contributes
  /// `sizes[w]` bytes; `sizes` is the same on every worker and `in` holds `sizes[rank]` bytes).
  virtual void all_gather(const void* in, void* out, const std::vector<std::size_t>& sizes,
                          Clock::time_point deadline) = 0;

  /// `buf` (`bytes` bytes) on every worker = the chief's (rank 0).
  virtual void broadcast(void* buf, std::size_t bytes, Clock::time_point deadline) = 0;

  /// Makes an operation in flight on another thread fail now, and every later one fail at once
  /// (the job is being torn down after a failure). Callable from any thread, any number of times.
  virtual void interrupt() noexcept = 0;
};

/// Thrown by transports when an operation failed: `timed_out` when its deadline passed.
struct TransportError {
  bool timed_out;
  std::string message;
};

}  // namespace mirrored::detail::cluster
