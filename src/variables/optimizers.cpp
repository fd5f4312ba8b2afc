// Optimizer<T>'s members and OptimizerAccess's (declared in <mirrored/optimizer.hpp>), and the
// built-in optimizers of <mirrored/optimizers.hpp>, compiled for float and double, the element
// types optimizers take: a user's translation unit declares them and calls them.
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

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/optimizer_formulas.hpp"
#include "mirrored/detail/optimizer_step.hpp"
#include "mirrored/optimizer.hpp"
#include "mirrored/optimizers.hpp"

namespace mirrored::optimizers {

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

template <class T>
std::vector<std::string> FormulaOptimizer<T>::slot_names() const {
  const detail::OptimizerUpdate u = parameters();
  std::vector<std::string> names;
  for (int k = 0; k < detail::optimizer_slot_count(u.kind); ++k)
    names.emplace_back(detail::optimizer_slot_name(u.kind, k));
  return names;
}

template <class T>
double FormulaOptimizer<T>::initial_slot_value(std::size_t k) const {
  return detail::optimizer_slot_initial(parameters(), static_cast<int>(k));
}

template <class T>
void FormulaOptimizer<T>::update(T* w, const T* g, std::vector<T*>& slots, int64_t n, int64_t step) {
  detail::UpdateSegment segment;
  segment.param = w;
  segment.grad = g;
  segment.count = n;
  for (std::size_t k = 0; k < slots.size() && k < std::size(segment.slot); ++k) segment.slot[k] = slots[k];
  detail::apply_formula_on_host(dtype_of<T>(), parameters(), segment, step);
}

template class Optimizer<float>;
template class Optimizer<double>;
template class FormulaOptimizer<float>;
template class FormulaOptimizer<double>;
template class SGD<float>;
template class SGD<double>;
template class Adam<float>;
template class Adam<double>;
template class AdamW<float>;
template class AdamW<double>;
template class RMSprop<float>;
template class RMSprop<double>;
template class Adagrad<float>;
template class Adagrad<double>;

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

#define MIRRORED_OPTIMIZER_ACCESS(T)                                                                      \
  template std::vector<OptimizerAccess::Slot<T>> OptimizerAccess::slots(const optimizers::Optimizer<T>&); \
  template bool OptimizerAccess::has_slots(const optimizers::Optimizer<T>&, const Variable<T>&);          \
  template std::optional<Variable<int64_t>> OptimizerAccess::iterations(const optimizers::Optimizer<T>&);
MIRRORED_OPTIMIZER_ACCESS(float)
MIRRORED_OPTIMIZER_ACCESS(double)
#undef MIRRORED_OPTIMIZER_ACCESS

}  // namespace mirrored::detail
