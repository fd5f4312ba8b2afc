#pragma once
/// \file
/// `GradientBuckets<T>`: all-reduces gradients in buckets while the backward pass still produces
/// the next ones (the role of PyTorch DDP's reducer; beyond TF).

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/detail/pack_rule.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/reduce_op.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {

/// One per replica, inside `Strategy::run`: `push` the gradients as the backward pass produces
/// them; each bucket of about `bytes_per_pack` bytes starts its asynchronous all-reduce
/// (`ReplicaContext::all_reduce_async`) as soon as it is full, so communication overlaps the rest
/// of the backward pass; `finish` waits and returns the reduced gradients in push order, each
/// bitwise what `all_reduce(op, grad)` gives. A bucket is full once its gradients reach
/// `bytes_per_pack` bytes (the gradient that crosses the line belongs to it); `finish` starts the
/// last, partial one. Every replica must push gradients of the same shapes in the same order
/// (mismatches surface from `finish` like `all_reduce`'s); a gradient that nothing else refers to
/// (moved in) is reduced in place. Buckets hold one element type; a model with several uses one
/// `GradientBuckets` per type (every replica creating and using them in the same order). After
/// `finish` the object is empty and may be used for the next step.
template <class T>
class GradientBuckets {
 public:
  /// \throws FailedPreconditionError outside a replica context of a `run` (in cross-replica
  /// context); InvalidArgumentError for a negative `bytes_per_pack` or MEAN of an integer type.
  explicit GradientBuckets(ReduceOp op = ReduceOp::SUM, int64_t bytes_per_pack = 25 << 20)
      : GradientBuckets(op, CommunicationOptions{.bytes_per_pack = bytes_per_pack}) {}

  /// Buckets of `options.bytes_per_pack` bytes (0: one bucket, which `finish` starts); every
  /// bucket's all-reduce takes the rest of `options` (`compression`: gradients cross workers in
  /// half precision; `timeout_seconds`; `implementation`). Same errors as above.
  GradientBuckets(ReduceOp op, const CommunicationOptions& options)
      : op_(op), options_(options), ctx_(get_replica_context()) {
    MIRRORED_ENFORCE(ctx_ != nullptr, FailedPreconditionError,
                     "GradientBuckets must be created inside Strategy::run (in a replica context), not in "
                     "cross-replica context");
    MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError,
                     "GradientBuckets: bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
    MIRRORED_ENFORCE(op != ReduceOp::MEAN || !std::is_integral_v<T>, InvalidArgumentError,
                     "GradientBuckets on replica ", ctx_->replica_id_in_sync_group(),
                     ": MEAN of integer values has no exact integer result; reduce floating-point values instead");
  }

  /// Adds `grad` to the current bucket and starts that bucket's all-reduce once it is full
  /// (`bytes_per_pack` 0: never; everything goes in one bucket at `finish`). \throws
  /// FailedPreconditionError on a thread other than the replica's that created it.
  void push(Tensor<T> grad) {
    check_thread("push");
    bytes_ += grad.numel() * static_cast<int64_t>(sizeof(T));
    current_.push_back(std::move(grad));
    if (detail::pack_is_full(bytes_, options_.bytes_per_pack)) start_bucket();
  }

  /// Starts the last bucket, waits for every bucket and returns the reduced gradients in push
  /// order (empty when nothing was pushed). \throws what `PendingCollective::wait` throws (the
  /// other buckets are waited for first); FailedPreconditionError on another thread.
  std::vector<Tensor<T>> finish() {
    check_thread("finish");
    if (!current_.empty()) start_bucket();
    // Moved out first: an error leaves the object empty, and the other buckets' destructors wait.
    std::vector<PendingCollective<std::vector<Tensor<T>>>> pending = std::move(pending_);
    pending_.clear();
    std::vector<Tensor<T>> out;
    out.reserve(static_cast<std::size_t>(pushed_));
    pushed_ = 0;
    for (auto& bucket : pending) {
      for (auto& g : bucket.wait()) out.push_back(std::move(g));
    }
    return out;
  }

 private:
  void check_thread(const char* op) const {
    MIRRORED_ENFORCE(get_replica_context() == ctx_, FailedPreconditionError, "GradientBuckets::", op,
                     ": called outside the replica (thread and run) that created it");
  }
  void start_bucket() {
    CommunicationOptions options = options_;
    options.bytes_per_pack = 0;  // the bucket is one pack
    pushed_ += static_cast<int64_t>(current_.size());
    std::vector<Tensor<T>> bucket = std::move(current_);
    current_.clear();
    bytes_ = 0;
    pending_.push_back(ctx_->all_reduce_async(op_, std::move(bucket), options));
  }

  ReduceOp op_;
  CommunicationOptions options_;  // bytes_per_pack: the bucket size
  ReplicaContext* ctx_;
  std::vector<Tensor<T>> current_;
  int64_t bytes_ = 0;
  int64_t pushed_ = 0;  // gradients in started buckets
  std::vector<PendingCollective<std::vector<Tensor<T>>>> pending_;
};

}  // namespace mirrored
