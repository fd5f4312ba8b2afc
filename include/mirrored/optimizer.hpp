#pragma once
/// \file
/// `optimizers::Optimizer<T>`, what every optimizer shares: gradient aggregation across replicas
/// (`apply_gradients`, one collective inside `Strategy::run`), slot variables, the step counter,
/// sharded optimizer state, and the checks that keep the mirrored copies identical. The built-in
/// optimizers (`SGD`, `Adam`, `AdamW`, `RMSprop`, `Adagrad`) are in <mirrored/optimizers.hpp>; an
/// optimizer of one's own derives from `Optimizer<T>` here.

#include <algorithm>
#include <array>
#include <cmath>
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

// ---------------------------------------------------------------------------------------------

template <class T>
const typename Optimizer<T>::Slots& Optimizer<T>::slots_for(const Variable<T>& var) {
  const void* key = &detail::VariableAccess::state(var);
  {
    std::lock_guard lock(mu_);
    auto it = slots_.find(key);
    if (it != slots_.end()) return it->second;
  }
  // Created like any variable: in the variable's strategy (once, shared, when inside run), else
  // on the plain variable's device, beside it.
  const Device device = home_device(var);
  Strategy* owner = detail::VariableAccess::state(var).strategy;
  const auto scope = owner_scope(owner);
  Slots s;
  for (const auto& slot : slot_names()) {
    VariableOptions o;
    o.name = var.name() + "/" + slot;
    o.trainable = false;
    const T initial = static_cast<T>(initial_slot_value(s.vars.size()));
    if (shard_optimizer_state_ && owner)
      s.vars.push_back(detail::VariableAccess::sharded_full<T>(*owner, var.shape(), initial, o));
    else
      s.vars.emplace_back(Tensor<T>::full(var.shape(), initial, device), o);
  }
  std::lock_guard lock(mu_);
  return slots_.emplace(key, std::move(s)).first->second;  // first replica to get here wins
}

template <class T>
void Optimizer<T>::build(const std::vector<Variable<T>>& vars) {
  for (const auto& v : vars) slots_for(v);
  {
    std::lock_guard lock(mu_);
    if (iterations_) return;
  }
  // Created outside the lock: inside run every replica takes part in creating it.
  const auto scope = owner_scope(vars.empty() ? nullptr : detail::VariableAccess::state(vars.front()).strategy);
  VariableOptions o;
  o.name = "iterations";
  o.trainable = false;
  o.aggregation = VariableAggregation::ONLY_FIRST_REPLICA;
  auto created = std::make_shared<Variable<int64_t>>(
      Tensor<int64_t>::scalar(0, vars.empty() ? cpu0 : home_device(vars.front())), o);
  std::lock_guard lock(mu_);
  if (!iterations_) iterations_ = std::move(created);
}

template <class T>
int64_t Optimizer<T>::iterations() const {
  std::lock_guard lock(mu_);
  return iterations_ ? iterations_->value().item() : 0;
}

template <class T>
Variable<T> Optimizer<T>::get_slot(const Variable<T>& var, const std::string& slot_name) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(&detail::VariableAccess::state(var));
  const auto names = slot_names();
  for (std::size_t i = 0; it != slots_.end() && i < names.size(); ++i)
    if (names[i] == slot_name) return it->second.vars[i];
  throw NotFoundError("optimizer has no slot '" + slot_name + "' for variable '" + var.name() + "'");
}

template <class T>
std::vector<int64_t> Optimizer<T>::state_bytes_per_replica() const {
  std::lock_guard lock(mu_);
  std::vector<int64_t> bytes;
  auto add = [&bytes](const auto& var) {
    const auto copies = var.components();
    if (bytes.size() < copies.size()) bytes.resize(copies.size());
    for (std::size_t r = 0; r < copies.size(); ++r) bytes[r] += static_cast<int64_t>(copies[r].bytes());
  };
  for (const auto& [key, slots] : slots_)
    for (const auto& v : slots.vars) add(v);
  if (iterations_) add(*iterations_);
  return bytes;
}

template <class T>
void Optimizer<T>::apply_to_copy(const Variable<T>& var, std::size_t r, const Tensor<T>& grad, int64_t step) {
  const Slots& s = slots_for(var);
  // Copy-on-write: a host copy nobody else holds is updated in place; one that a reader still
  // holds (a value() snapshot) is left alone and replaced by an updated copy.
  auto writable = [r](const Variable<T>& v) {
    Tensor<T> t = detail::VariableAccess::state(v).take(r);
    const bool in_place = t.device().is_host() && detail::TensorAccess::unique(t);
    return std::make_pair(in_place ? t : t.to(cpu0), t.device());
  };
  auto [w, device] = writable(var);
  const Tensor<T> g = grad.device().is_host() ? grad : grad.to(cpu0);
  std::vector<std::pair<Tensor<T>, Device>> slot_values;
  std::vector<T*> slot_ptrs;
  for (const auto& sv : s.vars) {
    slot_values.push_back(writable(sv));
    slot_ptrs.push_back(slot_values.back().first.data());
  }
  update(w.data(), g.data(), slot_ptrs, w.numel(), step);
  detail::VariableAccess::set_component(var, r, device.is_host() ? w : w.to(device));
  for (std::size_t k = 0; k < s.vars.size(); ++k) {
    const auto& [value, sd] = slot_values[k];
    detail::VariableAccess::set_component(s.vars[k], r, sd.is_host() ? value : value.to(sd));
  }
}

template <class T>
void Optimizer<T>::apply_fused(const detail::OptimizerUpdate& u, const std::vector<Variable<T>>& vars,
                               const std::vector<Tensor<T>>& grads, std::size_t r, Variable<int64_t>& iterations,
                               ReplicaContext* ctx, bool aggregate) {
  // Every copy this step writes is taken out of its variable and updated in place when nobody
  // else holds it; one that a reader still holds (a value() snapshot) is replaced by an updated
  // copy on its device (copy-on-write). Whatever was taken goes back if anything throws.
  struct Taken {
    detail::VariableState<T>* state;
    Tensor<T> value;
  };
  std::vector<Taken> taken;
  taken.reserve(vars.size() * (1 + slot_names().size()));
  struct Restore {
    std::vector<Taken>& taken;
    std::size_t r;
    bool done = false;
    ~Restore() {
      if (!done)
        for (auto& t : taken) t.state->set(r, std::move(t.value));
    }
  } restore{taken, r};
  auto take = [&](const Variable<T>& v) -> Tensor<T>& {
    auto& state = detail::VariableAccess::state(v);
    taken.push_back({&state, state.take(r)});
    Tensor<T>& t = taken.back().value;
    if (!detail::TensorAccess::unique(t)) t = t.clone();
    return t;
  };

  detail::OptimizerStep step;
  step.dtype = dtype_of<T>();
  step.update = u;
  step.aggregate = aggregate;
  step.pack = pack_gradients;
  step.communication = communication;
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const Slots& s = slots_for(vars[i]);
    const Tensor<T>& w = take(vars[i]);
    detail::SlotTensors slots{};
    MIRRORED_ENFORCE(s.vars.size() <= slots.size(), InvalidArgumentError, "apply_gradients: the fused update takes ",
                     slots.size(), " slots per variable at most, the optimizer keeps ", s.vars.size());
    for (std::size_t k = 0; k < s.vars.size(); ++k) {
      const Tensor<T>& slot = take(s.vars[k]);
      MIRRORED_ENFORCE(slot.device() == w.device(), FailedPreconditionError, "apply_gradients: slot '",
                       s.vars[k].name(), "' is on ", slot.device().to_string(), " but its variable '", vars[i].name(),
                       "' is on ", w.device().to_string());
      slots[k] = detail::TensorAccess::erase(slot);
      step.sharded = s.vars[k].is_sharded();
    }
    step.variables.push_back(&detail::VariableAccess::state(vars[i]));
    step.names.push_back(&detail::VariableAccess::state(vars[i]).name);
    step.params.push_back(detail::TensorAccess::erase(w));
    step.grads.push_back(detail::TensorAccess::erase(grads[i]));
    step.slots.push_back(std::move(slots));
  }
  auto& counter = detail::VariableAccess::state(iterations);
  const Tensor<int64_t> step_in = counter.get(r);
  const Tensor<int64_t> step_out = Tensor<int64_t>::empty({}, step_in.device());
  step.step_in = detail::TensorAccess::erase(step_in);
  step.step_out = detail::TensorAccess::erase(step_out);
  detail::apply_optimizer_step(ctx, step);
  restore.done = true;
  for (auto& t : taken) t.state->set(r, std::move(t.value));
  detail::VariableAccess::set_component(iterations, r, step_out);
}

template <class T>
void Optimizer<T>::apply_gradients(const GradsAndVars<T>& grads_and_vars, bool skip_gradients_aggregation) {
  std::vector<Tensor<T>> grads;
  std::vector<Variable<T>> vars;
  for (const auto& [g, v] : grads_and_vars) {
    if (g.shape() != v.shape()) {
      throw InvalidArgumentError("apply_gradients: gradient of shape " + detail::format_shape(g.shape()) +
                                 " for variable '" + v.name() + "' of shape " + detail::format_shape(v.shape()));
    }
    grads.push_back(g);
    vars.push_back(v);
  }
  if (vars.empty()) return;
  const std::optional<detail::OptimizerUpdate> fused = fused_update();
  if (fused) {
    // One pass updates each copy once: a variable listed twice would alias its own segment.
    for (std::size_t i = 0; i < vars.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        MIRRORED_ENFORCE(&detail::VariableAccess::state(vars[i]) != &detail::VariableAccess::state(vars[j]),
                         InvalidArgumentError, "apply_gradients: variable '", vars[i].name(), "' is listed twice (at ",
                         j, " and ", i, "); sum its gradients into one entry");
      }
    }
  }
  Strategy* owner = detail::VariableAccess::state(vars[0]).live_strategy("apply_gradients");
  for (const auto& v : vars) {
    Strategy* s = detail::VariableAccess::state(v).live_strategy("apply_gradients");
    if (s == owner) continue;
    // One of the two has no strategy: it was made outside the other's scope.
    const Variable<T>& outside = s ? vars[0] : v;
    const Variable<T>& inside = s ? v : vars[0];
    MIRRORED_ENFORCE(s && owner, FailedPreconditionError, "apply_gradients: variable '", outside.name(),
                     "' was made outside the scope of ", (s ? s : owner)->name(), ", which made '", inside.name(),
                     "'; make every variable the optimizer updates inside strategy.scope()");
    throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: apply_gradients got variables '" +
                                  vars[0].name() + "' and '" + v.name() + "' of different strategies");
  }
  // A variable made outside every scope has one copy: every replica would update it at once.
  MIRRORED_ENFORCE(owner || !detail::in_replica_thread(), FailedPreconditionError, "apply_gradients inside run of ",
                   get_strategy().name(), ": variable '", vars[0].name(),
                   "' was made outside the strategy's scope, so it has one copy that every replica would update at "
                   "once; make it inside strategy.scope()");
  MIRRORED_ENFORCE(fused || !shard_optimizer_state_, UnimplementedError,
                   "apply_gradients: shard_optimizer_state needs the fused update of a built-in optimizer, which "
                   "this optimizer's fused_update() declines");
  int replica = 0;
  ReplicaContext* ctx = nullptr;
  if (owner) {
    const auto place = detail::locate_variable(owner, vars[0].name(), "apply_gradients", true);
    MIRRORED_ENFORCE(place.replica_context, FailedPreconditionError, "apply_gradients on variables of ", owner->name(),
                     " must be called inside its run (in replica context), where gradients are all-reduced");
    replica = place.replica;
    ctx = get_replica_context();
  }
  // Every replica names the same variables before any slot is made or byte moves. Once every
  // variable has its state, the fused step's own rendezvous compares them (no second one per step);
  // creating state is a rendezvous of every replica, so they all see the same "has state".
  if (ctx && (!fused || !has_state_for(vars))) {
    std::vector<const void*> ids;
    std::vector<std::string> names;
    for (const auto& v : vars) {
      ids.push_back(&detail::VariableAccess::state(v));
      names.push_back(v.name());
    }
    detail::agree_on_variables(*ctx, "apply_gradients", ids, names);
  }
  build(vars);
  const auto r = static_cast<std::size_t>(replica);
  std::shared_ptr<Variable<int64_t>> iterations;
  {
    std::lock_guard lock(mu_);
    iterations = iterations_;
  }
  if (fused) {
    // The reduction (unless skipped) and the update in one collective of the library's plan.
    apply_fused(*fused, vars, grads, r, *iterations, ctx, !skip_gradients_aggregation);
    return;
  }
  if (ctx && !skip_gradients_aggregation) {
    if (pack_gradients) {
      grads = ctx->all_reduce(ReduceOp::SUM, grads, communication);
    } else {
      for (auto& g : grads) g = ctx->all_reduce(ReduceOp::SUM, g, communication);
    }
  }
  auto& counter = detail::VariableAccess::state(*iterations);
  const int64_t step = counter.get(r).item() + 1;
  for (std::size_t i = 0; i < vars.size(); ++i) apply_to_copy(vars[i], r, grads[i], step);
  detail::VariableAccess::set_component(*iterations, r, Tensor<int64_t>::scalar(step, counter.get(r).device()));
}

}  // namespace mirrored::optimizers

namespace mirrored::detail {

template <class T>
std::vector<OptimizerAccess::Slot<T>> OptimizerAccess::slots(const optimizers::Optimizer<T>& o) {
  const auto names = o.slot_names();
  std::lock_guard lock(o.mu_);
  std::vector<Slot<T>> out;
  for (const auto& [key, s] : o.slots_)
    for (std::size_t k = 0; k < s.vars.size() && k < names.size(); ++k) out.push_back({key, names[k], s.vars[k]});
  return out;
}

template <class T>
bool OptimizerAccess::has_slots(const optimizers::Optimizer<T>& o, const Variable<T>& var) {
  std::lock_guard lock(o.mu_);
  return o.slots_.count(&VariableAccess::state(var)) != 0;
}

template <class T>
std::optional<Variable<int64_t>> OptimizerAccess::iterations(const optimizers::Optimizer<T>& o) {
  std::lock_guard lock(o.mu_);
  if (!o.iterations_) return std::nullopt;
  return *o.iterations_;
}

}  // namespace mirrored::detail
