// The members of `Variable<T>` and `detail::VariableAccess::sharded_full`, compiled once for
// every element type that variables support (the DTypes of <mirrored/dtype.hpp>), so that a
// user's translation unit only declares them.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/variable.hpp"

namespace mirrored {
namespace {

// `t / n` for every element type, as Tensor's `operator/` with a number computes it (the number as
// a rank-0 tensor of `T` on t's device), which takes the built-in arithmetic types only: the half
// types, for which these members are compiled too, are not among them.
template <class T, class N>
Tensor<T> divide_by(const Tensor<T>& t, N n) {
  return t / Tensor<T>::scalar(static_cast<T>(n), t.device());
}

}  // namespace

template <class T>
Variable<T>::Variable(Tensor<T> initial_value, VariableOptions o) {
  ReplicaContext* replica = get_replica_context();
  const bool in_replica_of_strategy = detail::in_replica_thread() && has_strategy();
  Strategy* owner =
      (in_replica_of_strategy || (in_cross_replica_context() && has_strategy())) ? &get_strategy() : nullptr;
  detail::check_variable_options(o, dtype_name(dtype_of<T>()), !is_floating_element_v<T>, owner != nullptr);
  auto make_state = [](Strategy* s, const Tensor<T>& init, const VariableOptions& opts) {
    auto st = std::make_shared<detail::VariableState<T>>();
    st->name = opts.name;
    st->synchronization = opts.synchronization;
    st->aggregation = opts.aggregation;
    st->sync_on_read = opts.synchronization == VariableSynchronization::ON_READ && s;
    st->trainable = opts.trainable.value_or(!st->sync_on_read);
    st->strategy = s;
    if (s) {
      st->strategy_alive = s->weak_id();
      st->strategy_name = s->name() + " #" + std::to_string(s->id());
    }
    st->shape = init.shape();
    if (s) {
      Tensor<T> first = init;
      if (s->extended().num_workers() > 1) {
        // Every worker starts from the chief's value (TF's multi-worker variables do too).
        detail::UntypedTensor chief =
            detail::TensorAccess::erase(init.device().is_host() ? init.clone() : init.to(cpu0));
        detail::broadcast_initial_value(*s, chief);
        first = detail::TensorAccess::restore<T>(chief);
      }
      for (const Device& d : s->extended().worker_devices()) st->components.push_back(first.to(d));
    } else {
      st->components.push_back(init.clone());
    }
    return st;
  };
  if (in_replica_of_strategy) {
    // Inside run: created once (by replica 0, from its initial value) and shared by all replicas.
    state_ = replica->merge_call(
        [&](Strategy& s, const PerReplica<Tensor<T>>& init) { return make_state(&s, init[0], o); }, initial_value);
  } else {
    state_ = make_state(owner, initial_value, o);
  }
}

template <class T>
std::vector<Tensor<T>> Variable<T>::components() const {
  if (component_ >= 0) return {state_->get(static_cast<std::size_t>(component_))};
  std::lock_guard lock(state_->mu);
  return state_->components;
}

template <class T>
Tensor<T> Variable<T>::value() const {
  if (component_ >= 0) return state_->get(static_cast<std::size_t>(component_));
  Strategy* owner = state_->live_strategy("value");
  if (!owner) return state_->get(0);
  const auto place = detail::locate_variable(owner, state_->name, "value", false);
  if (state_->sharded) {
    MIRRORED_ENFORCE(!place.replica_context, FailedPreconditionError, "Variable '", state_->name,
                     "' is sharded across the replicas (each holds a slice); read it whole in cross-replica context, "
                     "not on replica ",
                     place.replica, " inside run");
    return sharded_read();
  }
  if (place.replica_context) return state_->get(static_cast<std::size_t>(place.replica));
  return state_->sync_on_read ? aggregate_read() : state_->get(0);
}

template <class T>
Tensor<T> Variable<T>::sharded_read() const {
  // The slices in global replica order are the flattened value (across workers a gather, a
  // collective of every worker, as a sync-on-read aggregate is).
  const Tensor<T> flat = state_->strategy->gather(PerReplica<Tensor<T>>(components()), 0);
  const Device& home = state_->get(0).device();
  return (flat.device() == home ? flat : flat.to(home)).reshape(state_->shape);
}

template <class T>
std::vector<Tensor<T>> Variable<T>::sharded_pieces(const Tensor<T>& value) const {
  Strategy& s = *state_->strategy;
  const auto local = static_cast<int64_t>(state_->components.size());
  std::vector<Tensor<T>> pieces;
  for (int64_t r = 0; r < local; ++r) {
    const auto piece =
        detail::balanced_piece(value.numel(), s.num_replicas_in_sync(), s.extended().worker_index() * local + r);
    const Device device = state_->get(static_cast<std::size_t>(r)).device();
    Tensor<T> t = Tensor<T>::empty({piece.count}, device);
    if (piece.count) detail::copy_between(t.data(), device, value.data() + piece.begin, value.device(), t.bytes());
    pieces.push_back(std::move(t));
  }
  return pieces;
}

template <class T>
Tensor<T> Variable<T>::aggregate_read() const {
  const auto copies = components();
  switch (state_->aggregation) {
    case VariableAggregation::NONE:
      throw InvalidArgumentError("Variable '" + state_->name +
                                 "': a sync-on-read variable with aggregation NONE cannot be read in cross-replica "
                                 "context; give it aggregation SUM, MEAN or ONLY_FIRST_REPLICA");
    case VariableAggregation::ONLY_FIRST_REPLICA: return copies[0];
    case VariableAggregation::SUM:
    case VariableAggregation::MEAN: {
      if (state_->strategy->num_replicas_in_sync() != static_cast<int>(copies.size())) {
        // Several workers: the aggregate spans every worker's copies (a collective, on the host).
        return state_->strategy->reduce(
            state_->aggregation == VariableAggregation::SUM ? ReduceOp::SUM : ReduceOp::MEAN,
            PerReplica<Tensor<T>>(copies), std::nullopt);
      }
      // Summed in replica order on the first copy's device, like every reduction here.
      const Device& d = copies[0].device();
      Tensor<T> total = copies[0].clone();
      for (std::size_t r = 1; r < copies.size(); ++r)
        total = total + (copies[r].device() == d ? copies[r] : copies[r].to(d));
      if (state_->aggregation == VariableAggregation::MEAN) total = divide_by(total, copies.size());
      return total;
    }
  }
  return copies[0];
}

template <class T>
Tensor<T> Variable<T>::as_tensor(const char* op, const Tensor<T>& v) const {
  if (v.shape() != state_->shape) {
    throw InvalidArgumentError("Variable '" + state_->name + "'." + op + ": value of shape " +
                               detail::format_shape(v.shape()) + " does not match the variable's shape " +
                               detail::format_shape(state_->shape));
  }
  return v;
}

template <class T>
Tensor<T> Variable<T>::apply(Op op, std::size_t r, const Tensor<T>& v) {
  std::lock_guard lock(state_->mu);
  Tensor<T>& c = state_->components[r];
  const Tensor<T> here = v.device() == c.device() ? v : v.to(c.device());
  switch (op) {
    case Op::assign: c = v.device() == c.device() ? v.clone() : here; break;
    case Op::add: c = c + here; break;
    case Op::sub: c = c - here; break;
  }
  return c;
}

template <class T>
Tensor<T> Variable<T>::replica_write(Op op, const char* name, int replica, const Tensor<T>& v) {
  const auto r = static_cast<std::size_t>(replica);
  if (state_->sync_on_read || state_->aggregation == VariableAggregation::NONE) return apply(op, r, v);
  ReplicaContext* ctx = get_replica_context();
  switch (state_->aggregation) {
    case VariableAggregation::SUM: return apply(op, r, ctx->all_reduce(ReduceOp::SUM, v));
    case VariableAggregation::MEAN: return apply(op, r, ctx->all_reduce(ReduceOp::MEAN, v));
    case VariableAggregation::ONLY_FIRST_REPLICA:
      return apply(op, r, ctx->merge_call([](Strategy&, const PerReplica<Tensor<T>>& all) { return all[0]; }, v));
    case VariableAggregation::NONE: break;
  }
  throw InternalError(std::string("Variable::") + name + ": unhandled aggregation");
}

template <class T>
Tensor<T> Variable<T>::cross_replica_write(Op op, const char* name, const std::vector<Tensor<T>>& per_copy) {
  const std::size_t n = state_->components.size();
  if (state_->sync_on_read && state_->aggregation == VariableAggregation::SUM) {
    if (op != Op::assign) {
      throw InvalidArgumentError("SyncOnReadVariable '" + state_->name + "' does not support `" + name +
                                 "` in cross-replica context when aggregation is set to "
                                 "`tf.VariableAggregation.SUM`.");
    }
    // Every copy of every worker holds v/N, so that the aggregate is v.
    const int all = state_->strategy->num_replicas_in_sync();
    for (std::size_t r = 0; r < n; ++r) apply(op, r, divide_by(per_copy[r], all));
  } else {
    for (std::size_t r = 0; r < n; ++r) apply(op, r, per_copy[r]);
  }
  if (state_->sharded) return sharded_read();
  return state_->sync_on_read ? aggregate_read() : state_->get(0);
}

template <class T>
Tensor<T> Variable<T>::write_per_replica(Op op, const char* name, const std::vector<Tensor<T>>& values) {
  const auto place = detail::locate_variable(state_->live_strategy(name), state_->name, name, true);
  MIRRORED_ENFORCE(!place.replica_context && component_ < 0 && state_->strategy, InvalidArgumentError, "Variable '",
                   state_->name, "'.", name,
                   ": a PerReplica value can only be written to a distributed variable in cross-replica context");
  MIRRORED_ENFORCE(!state_->sharded, InvalidArgumentError, "Variable '", state_->name, "'.", name,
                   ": a sharded variable takes one whole value (cut into its replicas' slices), not a PerReplica");
  MIRRORED_ENFORCE(values.size() == state_->components.size(), InvalidArgumentError, "Variable '", state_->name, "'.",
                   name, ": PerReplica value has ", values.size(), " components for ", state_->components.size(),
                   " copies");
  std::vector<Tensor<T>> per_copy;
  for (const auto& t : values) per_copy.push_back(as_tensor(name, t));
  return cross_replica_write(op, name, per_copy);
}

template <class T>
Tensor<T> Variable<T>::write_tensor(Op op, const char* name, const Tensor<T>& v) {
  const Tensor<T> t = as_tensor(name, v);
  if (component_ >= 0) return apply(op, static_cast<std::size_t>(component_), t);
  Strategy* owner = state_->live_strategy(name);
  if (!owner) return apply(op, 0, t);
  const auto place = detail::locate_variable(owner, state_->name, name, true);
  if (state_->sharded) {
    MIRRORED_ENFORCE(!place.replica_context, FailedPreconditionError, "Variable '", state_->name, "'.", name,
                     ": the variable is sharded across the replicas (each holds a slice); write it whole in "
                     "cross-replica context, not on replica ",
                     place.replica, " inside run");
    return cross_replica_write(op, name, sharded_pieces(t));
  }
  if (place.replica_context) return replica_write(op, name, place.replica, t);
  return cross_replica_write(op, name, std::vector<Tensor<T>>(state_->components.size(), t));
}

template <class T>
Variable<T> detail::VariableAccess::sharded_full(Strategy& strategy, const Shape& shape, T value,
                                                 const VariableOptions& o) {
  auto make = [&](Strategy& s) {
    auto st = std::make_shared<VariableState<T>>();
    st->name = o.name;
    st->synchronization = o.synchronization;
    st->aggregation = o.aggregation;
    st->trainable = o.trainable.value_or(false);
    st->sharded = true;
    st->strategy = &s;
    st->strategy_alive = s.weak_id();
    st->strategy_name = s.name() + " #" + std::to_string(s.id());
    st->shape = shape;
    const auto& devices = s.extended().worker_devices();
    const auto local = static_cast<int64_t>(devices.size());
    const int64_t numel = shape_numel(shape, sizeof(T));
    for (int64_t r = 0; r < local; ++r) {
      const auto piece = balanced_piece(numel, s.num_replicas_in_sync(), s.extended().worker_index() * local + r);
      st->components.push_back(Tensor<T>::full({piece.count}, value, devices[static_cast<std::size_t>(r)]));
    }
    return st;
  };
  if (in_replica_thread()) {
    // Inside run: made once (by replica 0's merge_fn) and shared by every replica.
    return Variable<T>(get_replica_context()->merge_call([&](Strategy& s) { return make(s); }), -1);
  }
  return Variable<T>(make(strategy), -1);
}

template <class T>
std::function<void()> Variable<T>::prepare_assign(const Tensor<T>& value) const {
  const Tensor<T> t = as_tensor("assign", value);
  std::vector<std::size_t> indices;
  if (component_ >= 0) {
    indices.push_back(static_cast<std::size_t>(component_));
  } else {
    Strategy* owner = state_->live_strategy("assign");
    if (owner) {
      const auto place = detail::locate_variable(owner, state_->name, "assign", true);
      MIRRORED_ENFORCE(!place.replica_context, FailedPreconditionError, "Variable '", state_->name,
                       "'.assign: a two-phase (all-or-nothing) assign is cross-replica only; called on replica ",
                       place.replica, " inside run");
    }
    for (std::size_t r = 0; r < state_->components.size(); ++r) indices.push_back(r);
  }
  const bool divide = component_ < 0 && state_->sync_on_read && state_->aggregation == VariableAggregation::SUM;
  const Tensor<T> per_copy = divide ? divide_by(t, indices.size()) : t;
  std::vector<Tensor<T>> copies;
  copies.reserve(indices.size());
  if (component_ < 0 && state_->sharded) {
    copies = sharded_pieces(t);
  } else {
    for (std::size_t r : indices) {
      const Device device = state_->get(r).device();
      copies.push_back(per_copy.device() == device ? per_copy.clone() : per_copy.to(device));
    }
  }
  return [state = state_, indices = std::move(indices), copies = std::move(copies)] {
    for (std::size_t k = 0; k < indices.size(); ++k) state->set(indices[k], copies[k]);
  };
}

template <class T>
std::string Variable<T>::to_string() const {
  auto describe = [&](int r, const Tensor<T>& t) {
    const std::vector<T> host = t.to_vector();
    return "<Variable '" + detail::component_name(state_->name, r) + "' shape=" + detail::format_shape(t.shape()) +
           " dtype=" + dtype_name(dtype_of<T>()) + ", value=" + detail::format_values(host.data(), t.shape()) + ">";
  };
  if (component_ >= 0) return describe(component_, state_->get(static_cast<std::size_t>(component_)));
  const auto copies = components();
  if (!state_->strategy) return describe(0, copies[0]);
  std::string out = state_->sharded        ? "ShardedVariable:{\n"
                    : state_->sync_on_read ? "SyncOnReadVariable:{\n"
                                           : "MirroredVariable:{\n";
  for (std::size_t r = 0; r < copies.size(); ++r)
    out += "  " + std::to_string(r) + ": " + describe(static_cast<int>(r), copies[r]) +
           (r + 1 < copies.size() ? ",\n" : "\n");
  return out + "}";
}

#define MIRRORED_INSTANTIATE_VARIABLE(T) \
  template class Variable<T>;            \
  template Variable<T> detail::VariableAccess::sharded_full<T>(Strategy&, const Shape&, T, const VariableOptions&);
MIRRORED_INSTANTIATE_VARIABLE(float)
MIRRORED_INSTANTIATE_VARIABLE(double)
MIRRORED_INSTANTIATE_VARIABLE(int32_t)
MIRRORED_INSTANTIATE_VARIABLE(int64_t)
MIRRORED_INSTANTIATE_VARIABLE(uint8_t)
MIRRORED_INSTANTIATE_VARIABLE(float16)
MIRRORED_INSTANTIATE_VARIABLE(bfloat16)
#undef MIRRORED_INSTANTIATE_VARIABLE

}  // namespace mirrored
