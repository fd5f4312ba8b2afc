#pragma once
/// \file
/// `optimizers::GradientAccumulator<T>`: gradient accumulation (docs/api.md §16; beyond TF, the role of
/// Keras 3's `gradient_accumulation_steps`, PyTorch DDP's `no_sync` and Horovod's
/// `backward_passes_per_step`): each replica sums the gradients of k micro-batches on its own
/// device, with no collective, and one `apply_gradients` applies the sum (or mean) as one step.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/errors.hpp"
#include "mirrored/optimizers.hpp"
#include "mirrored/reduce_op.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/tensor.hpp"
#include "mirrored/variable.hpp"

namespace mirrored::optimizers {

/// Sums gradients over micro-batches and applies them with one optimizer step.
///
/// One object serves every replica of a strategy: create it anywhere (beside the optimizer, so
/// that it lives across `run` calls, or inside the replica function for k micro-batches within
/// one `run`), and call `accumulate` and `apply_gradients` inside `Strategy::run`. Each replica
/// keeps its own sums, one buffer per variable on the device of its copy of that variable,
/// allocated at its first micro-batch and reused by every later accumulation cycle.
/// `accumulate` adds a micro-batch's gradients into them with the device backend's element-wise
/// sum (`DeviceBackend::sum_n`): no collective, no host copy of a device tensor. `apply_gradients(optimizer)` then
/// calls `optimizer.apply_gradients` once with the replica's sums, which all-reduces them across the replicas as any
/// step does (and, with `shard_optimizer_state`, reduce-scatters them into the sharded update), and starts the next
/// cycle.
///
/// The reduction over the micro-batches is `op`:
/// - `ReduceOp::MEAN` (the default, as Keras 3's `gradient_accumulation_steps` averages the
///   gradients since the last update): the sums are divided by k before the step. Right when each
///   micro-batch's gradient is already that of a whole step's loss (a loss scaled by the
///   micro-batch's global size).
/// - `ReduceOp::SUM` (Horovod's default `average_aggregated_gradients=False`; PyTorch's gradients
///   accumulated under `no_sync`): the sums are applied as they are. Right when each micro-batch's
///   loss is scaled by the whole step's global batch size, as `train_digits --accumulate` does;
///   with integer-valued gradients the step is then bitwise the step of the whole batch's
///   gradient (`apply_gradients` of the k micro-batches' sum).
///
/// The micro-batches are summed in the order they were accumulated (`((g1 + g2) + g3) ...`), so a
/// replica's sums are bitwise those of adding the tensors by hand in that order.
template <class T>
class GradientAccumulator {
  static_assert(std::is_floating_point_v<T>, "GradientAccumulator sums float or double gradients, as optimizers take");

 public:
  /// \throws InvalidArgumentError for an `op` other than SUM and MEAN.
  explicit GradientAccumulator(ReduceOp op = ReduceOp::MEAN) : op_(op) {
    MIRRORED_ENFORCE(op == ReduceOp::SUM || op == ReduceOp::MEAN, InvalidArgumentError,
                     "GradientAccumulator: op must be SUM or MEAN, got ", static_cast<int>(op));
  }

  /// The reduction over micro-batches (SUM or MEAN).
  ReduceOp op() const noexcept { return op_; }

  /// Adds one micro-batch's gradients to the calling replica's sums. The first micro-batch of a
  /// cycle names the variables; every later one must pass gradients of the same variables in the
  /// same order. Checks everything before adding anything (a failed call changes nothing).
  /// \throws FailedPreconditionError in cross-replica context, or for distributed variables
  /// outside their strategy's `run` ("Mixing different" for another strategy's);
  /// InvalidArgumentError for an empty list, a variable listed twice, a gradient whose shape
  /// differs from its variable's, or a list whose variables (count, names, order) differ from
  /// the cycle's first micro-batch's -- naming the replica, the variable and both sides.
  void accumulate(const GradsAndVars<T>& grads_and_vars);

  /// Applies the calling replica's accumulated gradients (divided by the number of micro-batches
  /// for MEAN) with one `optimizer.apply_gradients`, then starts a new cycle (the buffers are
  /// kept for it). Inside `run` of several replicas it is a collective: every replica calls it,
  /// and the replicas first exchange their micro-batch counts (a small all-gather), so that all
  /// of them reject a disagreement before any gradient moves. Once the optimizer has been called
  /// the cycle ends even if it throws (its collective may have consumed the sums). \throws
  /// FailedPreconditionError in cross-replica context, or when no replica accumulated a
  /// micro-batch since the last apply; InvalidArgumentError (on every replica) when replicas
  /// accumulated different numbers of micro-batches, naming both replicas and both counts (a
  /// failed check changes nothing); what `Optimizer::apply_gradients` and the collectives throw.
  void apply_gradients(Optimizer<T>& optimizer);

  /// Micro-batches the calling replica accumulated since its last apply (0 outside any replica
  /// context, e.g. in cross-replica context).
  int64_t micro_batches() const;

  /// Discards the calling replica's accumulated gradients (the buffers are kept). Local: no
  /// collective; every replica that accumulated should call it. \throws FailedPreconditionError in
  /// cross-replica context.
  void reset();

 private:
  // One replica's accumulation: touched only by that replica's thread once created.
  struct ReplicaSums {
    std::vector<Variable<T>> vars;  // the current cycle's variables (in accumulate order)
    std::vector<Tensor<T>> sums;    // per variable: the buffer on the copy's device
    int64_t count = 0;              // micro-batches in the current cycle
  };
  // The calling thread's replica context, or FailedPreconditionError naming `op`.
  static ReplicaContext& context(const char* op);
  static std::pair<std::uint64_t, int> key(const ReplicaContext& ctx) {
    const auto id = ctx.strategy().weak_id().lock();  // alive: the context's run is
    return {id ? *id : 0, detail::local_replica_index(ctx)};
  }
  // The calling replica's sums, created on first use.
  ReplicaSums& sums_of(const ReplicaContext& ctx);
  // Checks every replica's micro-batch count (a collective when there are several); throws the
  // same error on every replica.
  static void agree_on_count(ReplicaContext& ctx, int64_t count);

  ReduceOp op_;
  mutable std::mutex mu_;
  // By strategy (its process-wide id: an address may be reused by a later strategy) and local
  // replica index.
  std::map<std::pair<std::uint64_t, int>, std::unique_ptr<ReplicaSums>> replicas_;
};

// ---------------------------------------------------------------------------------------------
// The members are compiled for float and double, the element types optimizers take
// (src/variables/gradient_accumulator.cpp).

extern template class GradientAccumulator<float>;
extern template class GradientAccumulator<double>;

}  // namespace mirrored::optimizers
