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

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
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

template <class T>
ReplicaContext& GradientAccumulator<T>::context(const char* op) {
  ReplicaContext* ctx = get_replica_context();
  MIRRORED_ENFORCE(ctx != nullptr, FailedPreconditionError, "GradientAccumulator::", op,
                   " must be called inside Strategy::run (in a replica context), not in cross-replica context");
  return *ctx;
}

template <class T>
typename GradientAccumulator<T>::ReplicaSums& GradientAccumulator<T>::sums_of(const ReplicaContext& ctx) {
  std::lock_guard lock(mu_);
  auto& slot = replicas_[key(ctx)];
  if (!slot) slot = std::make_unique<ReplicaSums>();
  return *slot;
}

template <class T>
int64_t GradientAccumulator<T>::micro_batches() const {
  const ReplicaContext* ctx = get_replica_context();
  if (!ctx) return 0;
  std::lock_guard lock(mu_);
  const auto it = replicas_.find(key(*ctx));
  return it == replicas_.end() ? 0 : it->second->count;
}

template <class T>
void GradientAccumulator<T>::reset() {
  sums_of(context("reset")).count = 0;
}

template <class T>
void GradientAccumulator<T>::accumulate(const GradsAndVars<T>& grads_and_vars) {
  ReplicaContext& ctx = context("accumulate");
  const int replica = ctx.replica_id_in_sync_group();
  const int local = detail::local_replica_index(ctx);
  ReplicaSums& mine = sums_of(ctx);
  MIRRORED_ENFORCE(!grads_and_vars.empty(), InvalidArgumentError, "GradientAccumulator::accumulate on replica ",
                   replica, ": no gradients");
  // Every check first: a failed call changes nothing.
  std::vector<Device> devices;  // per variable: the device of this replica's copy
  for (std::size_t i = 0; i < grads_and_vars.size(); ++i) {
    const auto& [g, v] = grads_and_vars[i];
    MIRRORED_ENFORCE(g.shape() == v.shape(), InvalidArgumentError, "GradientAccumulator::accumulate on replica ",
                     replica, ": gradient of shape ", detail::format_shape(g.shape()), " for variable '", v.name(),
                     "' of shape ", detail::format_shape(v.shape()));
    const auto& state = detail::VariableAccess::state(v);
    Strategy* owner = state.live_strategy("GradientAccumulator::accumulate");
    std::size_t copy = 0;
    if (owner) {
      const auto place = detail::locate_variable(owner, v.name(), "GradientAccumulator::accumulate", true);
      MIRRORED_ENFORCE(place.replica_context, FailedPreconditionError,
                       "GradientAccumulator::accumulate on variables of ", owner->name(),
                       " must be called inside its run (in replica context)");
      copy = static_cast<std::size_t>(local);
    }
    devices.push_back(state.get(copy).device());
    for (std::size_t j = 0; j < i; ++j) {
      MIRRORED_ENFORCE(&detail::VariableAccess::state(grads_and_vars[j].second) != &state, InvalidArgumentError,
                       "GradientAccumulator::accumulate on replica ", replica, ": variable '", v.name(),
                       "' is listed twice (at ", j, " and ", i, "); sum its gradients into one entry");
    }
  }
  if (mine.count > 0) {
    MIRRORED_ENFORCE(grads_and_vars.size() == mine.vars.size(), InvalidArgumentError,
                     "GradientAccumulator::accumulate on replica ", replica, ": micro-batch ", mine.count + 1,
                     " passes ", grads_and_vars.size(), " gradients but the cycle's first micro-batch passed ",
                     mine.vars.size());
    for (std::size_t i = 0; i < mine.vars.size(); ++i) {
      const Variable<T>& v = grads_and_vars[i].second;
      MIRRORED_ENFORCE(&detail::VariableAccess::state(v) == &detail::VariableAccess::state(mine.vars[i]),
                       InvalidArgumentError, "GradientAccumulator::accumulate on replica ", replica, ": micro-batch ",
                       mine.count + 1, " passes variable '", v.name(), "' at position ", i,
                       " but the cycle's first micro-batch passed '", mine.vars[i].name(), "' there");
    }
  }

  // Commit. The first micro-batch of a cycle is copied into the buffers (kept from the last cycle
  // where the variable is the same); the later ones are added in place, in accumulate order.
  if (mine.count == 0) {
    std::vector<Variable<T>> vars;
    std::vector<Tensor<T>> sums;
    for (std::size_t i = 0; i < grads_and_vars.size(); ++i) {
      const auto& [g, v] = grads_and_vars[i];
      Tensor<T> buffer;
      for (std::size_t j = 0; j < mine.vars.size(); ++j) {
        if (&detail::VariableAccess::state(mine.vars[j]) == &detail::VariableAccess::state(v) &&
            mine.sums[j].shape() == g.shape() && mine.sums[j].device() == devices[i]) {
          buffer = mine.sums[j];
          break;
        }
      }
      if (buffer.device() != devices[i] || buffer.shape() != g.shape())
        buffer = Tensor<T>::empty(g.shape(), devices[i]);
      if (g.numel()) detail::copy_between(buffer.data(), devices[i], g.data(), g.device(), g.bytes());
      vars.push_back(v);
      sums.push_back(std::move(buffer));
    }
    mine.vars = std::move(vars);
    mine.sums = std::move(sums);
  } else {
    for (std::size_t i = 0; i < grads_and_vars.size(); ++i) {
      const Tensor<T>& g = grads_and_vars[i].first;
      Tensor<T>& sum = mine.sums[i];
      if (!g.numel()) continue;
      const Tensor<T> local_g = g.device() == sum.device() ? g : g.to(sum.device());
      // sum_n may write over an input: the sum grows in place, on the device.
      const void* inputs[2] = {sum.data(), local_g.data()};
      detail::backend_for(sum.device()).sum_n(dtype_of<T>(), inputs, 2, sum.data(), sum.numel());
    }
  }
  ++mine.count;
}

template <class T>
void GradientAccumulator<T>::agree_on_count(ReplicaContext& ctx, int64_t count) {
  const int n = ctx.num_replicas_in_sync();
  if (n > 1) {
    // Host memory: a few bytes, which the check reads on the host anyway.
    const std::vector<int64_t> counts = ctx.all_gather(Tensor<int64_t>::from_vector({count}, {1}), 0).to_vector();
    for (int r = 1; r < n; ++r) {
      MIRRORED_ENFORCE(counts[static_cast<std::size_t>(r)] == counts[0], InvalidArgumentError,
                       "GradientAccumulator::apply_gradients: replica 0 accumulated ", counts[0],
                       " micro-batches but replica ", r, " accumulated ", counts[static_cast<std::size_t>(r)]);
    }
  }
  MIRRORED_ENFORCE(count > 0, FailedPreconditionError, "GradientAccumulator::apply_gradients on replica ",
                   ctx.replica_id_in_sync_group(), ": no micro-batch was accumulated since the last apply");
}

template <class T>
void GradientAccumulator<T>::apply_gradients(Optimizer<T>& optimizer) {
  ReplicaContext& ctx = context("apply_gradients");
  ReplicaSums& mine = sums_of(ctx);
  agree_on_count(ctx, mine.count);
  GradsAndVars<T> summed;
  for (std::size_t i = 0; i < mine.vars.size(); ++i) {
    Tensor<T>& sum = mine.sums[i];
    if (op_ == ReduceOp::MEAN && mine.count > 1 && sum.numel())
      detail::backend_for(sum.device()).divide(dtype_of<T>(), sum.data(), sum.numel(), mine.count);
    summed.emplace_back(sum, mine.vars[i]);
  }
  mine.count = 0;  // the sums are handed over (and divided): whatever happens next, this cycle is over
  optimizer.apply_gradients(summed);
}

}  // namespace mirrored::optimizers
