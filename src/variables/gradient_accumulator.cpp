// The members of `optimizers::GradientAccumulator<T>`, compiled for float and double (the element
// types optimizers take), so that a user's translation unit only declares them.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/gradient_accumulator.hpp"

namespace mirrored::optimizers {

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

template class GradientAccumulator<float>;
template class GradientAccumulator<double>;

}  // namespace mirrored::optimizers
