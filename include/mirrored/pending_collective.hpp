#pragma once
/// \file
/// `PendingCollective<V>`: an asynchronous collective in flight, as `ReplicaContext::all_reduce_async`
/// returns it (beyond TF: the role of a PyTorch `Work` handle).

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "mirrored/detail/nest.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

namespace detail {
/// One asynchronous collective of one replica (src/runtime/async_collectives.hpp).
struct AsyncCollective;
/// Blocks the calling thread until `job` has run on the library's communication thread, makes the
/// calling thread's device stream wait for its completion (no host synchronisation with the device)
/// and returns its outputs. \throws the error the collective ended with (once; later calls
/// throw FailedPreconditionError).
const std::vector<UntypedTensor>& wait_async(AsyncCollective& job);
/// True once `job` has finished on the host and on its device (also when it failed).
bool async_ready(const AsyncCollective& job) noexcept;
/// What the destructor of an unwaited PendingCollective does: waits for `job`; an error nobody
/// waited for fails the `run` it belongs to (as if the replica had thrown it).
void discard_async(AsyncCollective& job) noexcept;
}  // namespace detail

/// An asynchronous collective in flight. Move-only; the destructor waits for it (nothing is left
/// in flight), so a replica that drops or never waits for one still takes part in it.
/// Obtained from `ReplicaContext::all_reduce_async`.
template <class V>
class PendingCollective {
 public:
  /// Nothing in flight (`valid()` is false).
  PendingCollective() = default;
  PendingCollective(PendingCollective&&) noexcept = default;
  PendingCollective& operator=(PendingCollective&& other) noexcept {
    if (this != &other) {
      discard();
      job_ = std::move(other.job_);
      value_ = std::move(other.value_);
    }
    return *this;
  }
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective() { discard(); }

  /// The result, bitwise equal to what the synchronous `all_reduce` of the same values gives.
  /// Blocks until the library's communication thread has done the collective's host part (the
  /// agreement checks, enqueuing the device work); on a GPU it makes no host wait for the device:
  /// the calling thread's stream waits for the communication stream (an event) and the value is
  /// returned at once, and only reading it (e.g. `to_vector`) waits for the device. \throws what
  /// the synchronous call would (InvalidArgumentError for mismatched calls,
  /// FailedPreconditionError for a different call sequence, DeadlineExceededError when the
  /// collective was not complete `timeout_seconds` after it was issued, AbortedError when another
  /// replica failed); FailedPreconditionError when there is nothing to wait for (already waited,
  /// or moved from). A failure that only the device shows, after wait() returned, surfaces later:
  /// a device error (sticky, e.g. an illegal address) from the synchronisation that reads the
  /// value; an NCCL error or a collective NCCL did not complete by the deadline, which the
  /// communication thread then finds, fails the replica's `run` (the communicators are aborted, so
  /// the next collective fails too rather than hang); the value read meanwhile is not defined.
  V wait() {
    if (!job_) {
      throw FailedPreconditionError(
          "PendingCollective::wait: nothing to wait for (the result was already taken by wait(), or the "
          "PendingCollective was moved from)");
    }
    const std::shared_ptr<detail::AsyncCollective> job = std::move(job_);
    const std::vector<detail::UntypedTensor>& out = detail::wait_async(*job);
    std::size_t i = 0;
    V result = detail::unflatten<V>(*value_, out, i);
    value_.reset();
    return result;
  }

  /// True once `wait()` would return (or throw) at once. \throws nothing.
  bool ready() const noexcept { return !job_ || detail::async_ready(*job_); }
  /// True while there is a result to wait for.
  bool valid() const noexcept { return job_ != nullptr; }

 private:
  friend class ReplicaContext;
  PendingCollective(std::shared_ptr<detail::AsyncCollective> job, V value)
      : job_(std::move(job)), value_(std::move(value)) {}
  void discard() noexcept {
    if (job_) detail::discard_async(*job_);
    job_.reset();
    value_.reset();
  }

  std::shared_ptr<detail::AsyncCollective> job_;
  std::optional<V> value_;  // what was passed: the nest the result is rebuilt in
};

}  // namespace mirrored
