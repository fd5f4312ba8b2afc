#pragma once
/// \file
/// `optimizers::Optimizer<T>`, what every optimizer shares: gradient aggregation across replicas
/// (`apply_gradients`, one collective inside `Strategy::run`), slot variables, the step counter,
/// sharded optimizer state, and the checks that keep the mirrored copies identical. The built-in
/// optimizers (`SGD`, `Adam`, `AdamW`, `RMSprop`, `Adagrad`) are in <mirrored/optimizers.hpp>; an
/// optimizer of one's own derives from `Optimizer<T>` here.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/optimizer_step.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/tensor.hpp"
#include "mirrored/variable.hpp"

namespace mirrored::optimizers {
template <class T>
class Optimizer;
}  // namespace mirrored::optimizers

namespace mirrored::detail {
/// Library-internal access to an optimizer's state, for the checkpoint manager.
struct OptimizerAccess {
  /// One slot variable of the optimizer: the state of the variable it belongs to (the key
  /// `VariableAccess::state` gives), the slot's name ("m", "momentum", ...) and the slot.
  template <class T>
  struct Slot {
    const void* variable;
    std::string slot_name;
    Variable<T> slot;
  };
  /// Every slot the optimizer has created so far.
  template <class T>
  static std::vector<Slot<T>> slots(const optimizers::Optimizer<T>& o);
  /// The slot names the optimizer keeps per variable, in its order.
  template <class T>
  static std::vector<std::string> slot_names(const optimizers::Optimizer<T>& o) {
    return o.slot_names();
  }
  /// True when the optimizer has made its slots for `var` (at its first update or `build`).
  template <class T>
  static bool has_slots(const optimizers::Optimizer<T>& o, const Variable<T>& var);
  /// The step counter, if the optimizer has made it yet.
  template <class T>
  static std::optional<Variable<int64_t>> iterations(const optimizers::Optimizer<T>& o);
};

}  // namespace mirrored::detail

namespace mirrored::optimizers {

/// Gradients and the variables they belong to.
template <class T>
using GradsAndVars = std::vector<std::pair<Tensor<T>, Variable<T>>>;

/// What every optimizer shares: gradient aggregation, slot variables, the step counter.
template <class T>
class Optimizer {
  static_assert(std::is_floating_point_v<T>,
                "optimizers update float or double variables (keep float32 master weights for a "
                "float16/bfloat16 model)");

 public:
  virtual ~Optimizer() = default;

  /// Options of the gradient all-reduce (e.g. `bytes_per_pack`, `timeout_seconds`).
  CommunicationOptions communication;
  /// True (default): all gradients in one packed all-reduce. False: one all-reduce per gradient
  /// (for comparison and debugging; same result).
  bool pack_gradients = true;

  /// Applies one update. Inside `run` every replica must call it with gradients of the same
  /// variables in the same order. `skip_gradients_aggregation` (Keras' name): the gradients are
  /// already reduced across replicas (e.g. by `GradientBuckets`), so they are applied as given,
  /// without another all-reduce. \throws InvalidArgumentError when a gradient's shape differs
  /// from its variable's; FailedPreconditionError for distributed variables in cross-replica
  /// context (call it inside `run`) or variables of different strategies.
  void apply_gradients(const GradsAndVars<T>& grads_and_vars, bool skip_gradients_aggregation = false);
  /// Any other list is a mistake the compiler names (entries of another element type, or the
  /// variable before its gradient).
  template <class Other>
  void apply_gradients(const Other&, bool = false) {
    static_assert(sizeof(Other) == 0,
                  "apply_gradients takes GradsAndVars<T>: (gradient, variable) pairs of Tensor<T> and Variable<T>, "
                  "the gradient first, of the optimizer's element type T");
  }

  /// Creates the slot variables of `vars` now (in the current scope) instead of at the first
  /// `apply_gradients`. Optional.
  void build(const std::vector<Variable<T>>& vars);

  /// Number of updates applied (as seen by the calling replica).
  int64_t iterations() const;

  /// The slot `slot_name` (e.g. "momentum", "m", "v") of `var`. With `shard_optimizer_state` it is
  /// a sharded variable (`Variable::is_sharded`): read or assigned in cross-replica context it is
  /// the whole slot, so checkpoints hold the same tensors either way and restore into either, with
  /// any number of replicas. \throws NotFoundError if absent.
  Variable<T> get_slot(const Variable<T>& var, const std::string& slot_name) const;

  /// The bytes of optimizer state (slots and the step counter) each of this worker's replicas
  /// holds on its device, in replica order (one entry for plain variables). With
  /// `shard_optimizer_state` each replica holds about 1/N of every slot.
  std::vector<int64_t> state_bytes_per_replica() const;

 protected:
  /// Set by the built-in optimizers from their options: `apply_gradients` inside `run`
  /// reduce-scatters the gradients, updates this replica's slice of the weights with its slice of
  /// every slot (the only part of the slots it keeps), and all-gathers the weights into every copy.
  bool shard_optimizer_state_ = false;
  /// Slot names this optimizer keeps per variable.
  virtual std::vector<std::string> slot_names() const = 0;
  /// The value every element of slot `k` starts at (0 unless overridden).
  virtual double initial_slot_value(std::size_t k) const {
    (void)k;
    return 0;
  }
  /// Computes the new value of one copy of a variable (and of its slots, in place) on host memory.
  /// `step` is the 1-based update count.
  virtual void update(T* value, const T* grad, std::vector<T*>& slots, int64_t count, int64_t step) = 0;
  /// The same update as a backend operation (`DeviceBackend::apply_optimizer`), for optimizers
  /// whose `update` is one of the fused kinds; nullopt (the default, e.g. for an optimizer of
  /// one's own): `update` runs per variable on a host copy.
  virtual std::optional<detail::OptimizerUpdate> fused_update() const { return std::nullopt; }

 private:
  friend struct detail::OptimizerAccess;
  struct Slots {
    std::vector<Variable<T>> vars;
  };
  const Slots& slots_for(const Variable<T>& var);
  /// Where the optimizer's state for `var` is made: CPU:0 for a distributed variable (its
  /// strategy copies it to every replica device), the device of a plain variable.
  static Device home_device(const Variable<T>& var) {
    const auto& state = detail::VariableAccess::state(var);
    return state.strategy ? cpu0 : state.get(0).device();
  }
  /// The scope of `owner` (a distributed variable's strategy) when called outside its `run` and
  /// outside its scope: slots and the step counter of its variables are mirrored like them even
  /// when `build` runs outside the scope (nothing inside `run`, or for plain variables).
  static std::optional<Scope> owner_scope(Strategy* owner) {
    if (!owner || detail::in_replica_thread()) return std::nullopt;
    return owner->scope();
  }
  /// True when every one of `vars` has its slots and the step counter exists.
  bool has_state_for(const std::vector<Variable<T>>& vars) const {
    std::lock_guard lock(mu_);
    if (!iterations_) return false;
    for (const auto& v : vars)
      if (!slots_.count(&detail::VariableAccess::state(v))) return false;
    return true;
  }
  void apply_to_copy(const Variable<T>& var, std::size_t r, const Tensor<T>& grad, int64_t step);
  // The fused step of replica `r` (`ctx` null: plain variables) through the library's collective
  // plan; `aggregate`: sum the gradients across replicas first.
  void apply_fused(const detail::OptimizerUpdate& u, const std::vector<Variable<T>>& vars,
                   const std::vector<Tensor<T>>& grads, std::size_t r, Variable<int64_t>& iterations,
                   ReplicaContext* ctx, bool aggregate);

  mutable std::mutex mu_;
  std::map<const void*, Slots> slots_;  // keyed by the variable's state
  std::shared_ptr<Variable<int64_t>> iterations_;
};

// Optimizer<T>'s members not defined in the class, and OptimizerAccess's, are compiled for the
// element types optimizers take, float and double (src/variables/optimizers.cpp).
extern template class Optimizer<float>;
extern template class Optimizer<double>;

}  // namespace mirrored::optimizers
