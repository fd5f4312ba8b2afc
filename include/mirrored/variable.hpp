#pragma once
/// \file
/// `Variable<T>`: state that stays identical on every replica (mirrored), or that each replica
/// keeps for itself and that is aggregated when read (sync-on-read).

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/strategy.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {

/// When the copies of a distributed variable are kept in sync.
enum class VariableSynchronization { AUTO, NONE, ON_WRITE, ON_READ };
/// How replica-context writes (mirrored) or cross-replica reads (sync-on-read) combine replicas.
enum class VariableAggregation { NONE, SUM, MEAN, ONLY_FIRST_REPLICA };

/// "NONE", "SUM", … as TF names them (`tf.VariableAggregation.SUM` prints as `VariableAggregation.SUM`).
const char* variable_aggregation_name(VariableAggregation a) noexcept;
const char* variable_synchronization_name(VariableSynchronization s) noexcept;

/// Options of a new variable.
struct VariableOptions {
  std::string name = "Variable";
  /// Default: true, except for ON_READ variables (as in TF).
  std::optional<bool> trainable = std::nullopt;
  VariableSynchronization synchronization = VariableSynchronization::AUTO;
  VariableAggregation aggregation = VariableAggregation::NONE;
};

namespace detail {

/// Where the calling thread is relative to a variable's strategy.
struct VariablePlace {
  bool replica_context;  // true: inside `run` of the variable's strategy, as replica `replica`
  int replica;
};

/// Resolves the calling thread's context for an operation `op` on variable `name` owned by
/// `owner` (nullptr: a plain variable). \throws FailedPreconditionError ("Mixing different
/// tf.distribute.Strategy objects") when writing a variable of another strategy.
VariablePlace locate_variable(const Strategy* owner, const std::string& name, const char* op, bool write);

/// Validates creation options. \throws InvalidArgumentError for NONE synchronization in a
/// strategy, or MEAN aggregation of an integer dtype.
void check_variable_options(const VariableOptions& o, const std::string& dtype, bool integer, bool distributed);

/// Component names: `name:0`, `name/replica_1:0`, …
std::string component_name(const std::string& name, int replica);

/// \throws FailedPreconditionError: variable `name`'s strategy (`strategy`, e.g.
/// "MirroredStrategy #3") has been destroyed, so `op` cannot run.
[[noreturn]] void throw_strategy_destroyed(const std::string& name, const std::string& strategy, const char* op);

/// The state behind a variable handle.
template <class T>
struct VariableState {
  std::string name;
  bool trainable = true;
  VariableSynchronization synchronization = VariableSynchronization::AUTO;
  VariableAggregation aggregation = VariableAggregation::NONE;
  bool sync_on_read = false;
  // Each copy holds only its replica's BALANCED piece of the flattened value (rank 1), in global
  // replica order across workers: an optimizer's slots with `shard_optimizer_state`.
  bool sharded = false;
  Strategy* strategy = nullptr;                       // nullptr: a plain variable
  std::weak_ptr<const std::uint64_t> strategy_alive;  // Strategy::weak_id(): expires with it
  std::string strategy_name;                          // "MirroredStrategy #3", for messages
  Shape shape;
  mutable std::mutex mu;
  std::vector<Tensor<T>> components;  // one per replica device (one for plain variables)

  Tensor<T> get(std::size_t r) const {
    std::lock_guard lock(mu);
    return components[r];
  }
  void set(std::size_t r, Tensor<T> t) {
    std::lock_guard lock(mu);
    components[r] = std::move(t);
  }
  /// `strategy`, checked to exist still (its address may have been reused by a newer strategy).
  /// \throws FailedPreconditionError naming the variable and `op` once the strategy is destroyed.
  Strategy* live_strategy(const char* op) const {
    if (strategy && strategy_alive.expired()) throw_strategy_destroyed(name, strategy_name, op);
    return strategy;
  }
  /// True when the variable belongs to `s` (and not to a destroyed strategy at the same address).
  bool belongs_to(const Strategy* s) const noexcept { return strategy == s && s && !strategy_alive.expired(); }
  /// Takes copy `r` out (leaving an empty tensor until `set`), so that a caller holding the only
  /// handle may update it in place.
  Tensor<T> take(std::size_t r) {
    std::lock_guard lock(mu);
    return std::exchange(components[r], Tensor<T>());
  }
};

struct VariableAccess;

}  // namespace detail

/// A variable: a shared handle (copies refer to the same variable). Created inside a strategy's
/// `scope()` (or inside its `run`, where it is created once and shared by all replicas) it has
/// one component per replica device, all initialised from the initial value: ON_WRITE/AUTO
/// synchronization makes it mirrored, ON_READ sync-on-read. Created outside any strategy it is
/// a plain variable with one component.
///
/// Reads: in replica context the replica's own copy; in cross-replica context a mirrored
/// variable's first copy, a sync-on-read variable's copies aggregated (SUM, MEAN,
/// ONLY_FIRST_REPLICA; NONE → InvalidArgumentError).
///
/// Writes (`assign`, `assign_add`, `assign_sub`): in replica context a mirrored variable combines
/// the replicas' values by its aggregation — NONE: only the local copy; SUM/MEAN: all-reduced,
/// then applied to every copy (every replica must make the call, like a collective);
/// ONLY_FIRST_REPLICA: replica 0's value applied to every copy. A sync-on-read variable's replica
/// writes touch the local copy. In cross-replica context writes apply to every copy (a
/// `PerReplica` value gives each copy its own component); a sync-on-read SUM variable's `assign(v)`
/// stores v/N per copy, and its `assign_add`/`assign_sub` throw InvalidArgumentError.
///
/// Lifetime: a distributed variable must not outlive its strategy. Its copies stay valid (handles
/// keep them alive, and `components()` and printing still work), but once the strategy is
/// destroyed every operation that needs it — `value`, `read_value`, `assign*`, `extended().update`,
/// `apply_gradients`, `checkpoint::save`/`restore` — throws FailedPreconditionError, also when a
/// newer strategy happens to live at the same address.
template <class T>
class Variable {
 public:
  using value_type = T;

  /// \throws InvalidArgumentError for NONE synchronization inside a strategy, or MEAN
  /// aggregation of an integer dtype.
  explicit Variable(Tensor<T> initial_value, VariableOptions o = {});
  explicit Variable(T initial_value, VariableOptions o = {})
      : Variable(Tensor<T>::scalar(initial_value), std::move(o)) {}

  /// The current value (see class comment for which copy). Shares storage with the variable's
  /// copy at the time of the call; later writes do not change it.
  Tensor<T> value() const;
  /// An independent copy of `value()`.
  Tensor<T> read_value() const { return value().clone(); }

  /// Sets the value. `V`: `Tensor<T>`, `T`, or (cross-replica only) `PerReplica<Tensor<T>>`.
  /// Returns the new value as `value()` would. \throws InvalidArgumentError on a shape mismatch
  /// or a misuse named in the class comment; FailedPreconditionError for a variable of another
  /// strategy ("Mixing different tf.distribute.Strategy objects").
  template <class V>
  Tensor<T> assign(const V& v) {
    return write(Op::assign, "assign", v);
  }
  /// Adds to the value (same rules as `assign`).
  template <class V>
  Tensor<T> assign_add(const V& v) {
    return write(Op::add, "assign_add", v);
  }
  /// Subtracts from the value (same rules as `assign`).
  template <class V>
  Tensor<T> assign_sub(const V& v) {
    return write(Op::sub, "assign_sub", v);
  }

  /// True for a mirrored (ON_WRITE/AUTO, created in a strategy) variable.
  bool is_mirrored() const noexcept {
    return state_->strategy && !state_->sync_on_read && !state_->sharded && component_ < 0;
  }
  /// True for a sharded variable (beyond TF's API for mirrored strategies; TF's `ShardedVariable`):
  /// each replica's copy holds only its slice of the flattened value (BALANCED over every replica of
  /// every worker), as an optimizer keeps its slots with `shard_optimizer_state`. Read and written
  /// whole in cross-replica context (the slices are gathered, or cut), where it behaves as a
  /// mirrored variable of its full shape (so checkpoints hold the same tensors either way); inside
  /// `run`, reads and writes of the whole throw FailedPreconditionError (each replica has only its
  /// slice: `experimental_local_results` and `extended().update` reach the slices).
  bool is_sharded() const noexcept { return state_->strategy && state_->sharded && component_ < 0; }
  /// True for a sync-on-read (ON_READ, created in a strategy) variable.
  bool is_sync_on_read() const noexcept { return state_->strategy && state_->sync_on_read && component_ < 0; }
  /// The name given at creation (without `:0`).
  const std::string& name() const noexcept { return state_->name; }
  bool trainable() const noexcept { return state_->trainable; }
  const Shape& shape() const noexcept { return state_->shape; }
  static constexpr DType dtype() noexcept { return dtype_of<T>(); }
  VariableSynchronization synchronization() const noexcept { return state_->synchronization; }
  VariableAggregation aggregation() const noexcept { return state_->aggregation; }
  /// The strategy the variable belongs to, or nullptr for a plain variable. After that strategy
  /// is destroyed this is a dangling address (see the lifetime rule above): compare it, never use it.
  Strategy* strategy() const noexcept { return state_->strategy; }
  /// Number of copies (replicas; 1 for a plain variable or a component view).
  std::size_t num_components() const noexcept { return component_ < 0 ? state_->components.size() : 1; }
  /// The copies, in replica order (one for a plain variable or a component view).
  std::vector<Tensor<T>> components() const;
  /// True when both handles refer to the same variable (and the same component view).
  friend bool operator==(const Variable& a, const Variable& b) noexcept {
    return a.state_ == b.state_ && a.component_ == b.component_;
  }

  /// `<Variable 'Variable:0' shape=() dtype=float32, value=1.0>`, or for distributed variables
  /// `MirroredVariable:{\n  0: <Variable 'Variable:0' …>,\n  1: <Variable 'Variable/replica_1:0' …>\n}`
  /// (`SyncOnReadVariable:{…}` for sync-on-read).
  friend std::ostream& operator<<(std::ostream& os, const Variable& v) { return os << v.to_string(); }

 private:
  friend struct detail::VariableAccess;
  enum class Op { assign, add, sub };

  Variable(std::shared_ptr<detail::VariableState<T>> state, int component)
      : state_(std::move(state)), component_(component) {}

  std::string to_string() const;
  Tensor<T> as_tensor(const char* op, const Tensor<T>& v) const;
  Tensor<T> apply(Op op, std::size_t r, const Tensor<T>& v);
  Tensor<T> aggregate_read() const;
  Tensor<T> replica_write(Op op, const char* name, int replica, const Tensor<T>& v);
  Tensor<T> cross_replica_write(Op op, const char* name, const std::vector<Tensor<T>>& per_copy);

  template <class V>
  Tensor<T> write(Op op, const char* name, const V& v);
  std::function<void()> prepare_assign(const Tensor<T>& value) const;
  // Sharded variables: the whole value gathered from the slices, and `value` cut into them (one
  // per copy, on its device).
  Tensor<T> sharded_read() const;
  std::vector<Tensor<T>> sharded_pieces(const Tensor<T>& value) const;

  std::shared_ptr<detail::VariableState<T>> state_;
  int component_ = -1;  // >= 0: a view of that copy alone (see StrategyExtended::update)
};

namespace detail {
/// Library-internal access to variable components.
struct VariableAccess {
  /// A handle naming copy `r` of `v` alone: writes through it touch only that copy.
  template <class T>
  static Variable<T> component(const Variable<T>& v, int r) {
    return Variable<T>(v.state_, v.component_ >= 0 ? v.component_ : r);
  }
  template <class T>
  static VariableState<T>& state(const Variable<T>& v) {
    return *v.state_;
  }
  /// Index of the copy a component view names (-1 for a whole variable).
  template <class T>
  static int component_index(const Variable<T>& v) noexcept {
    return v.component_;
  }
  /// Replaces copy `r` with `t` (no copy, no aggregation): for optimizers that computed the new
  /// value into a fresh tensor on the copy's device.
  template <class T>
  static void set_component(const Variable<T>& v, std::size_t r, Tensor<T> t) {
    v.state_->set(r, std::move(t));
  }
  /// Phase one of a cross-replica `v.assign(value)`: every check it makes and every copy it needs
  /// (one per replica device), but nothing stored. Returns phase two, which stores the copies and
  /// does nothing that can fail, so that a caller assigning many variables can check and copy all
  /// of them before changing any (checkpoint::restore). \throws what `assign` throws.
  template <class T>
  static std::function<void()> prepare_assign(const Variable<T>& v, const Tensor<T>& value) {
    return v.prepare_assign(value);
  }
  /// A new sharded variable of `shape` (see `Variable::is_sharded`) of strategy `s`, every element
  /// `value`: inside its `run` made once (every replica calls this and gets the same variable), in
  /// cross-replica context at once.
  template <class T>
  static Variable<T> sharded_full(Strategy& s, const Shape& shape, T value, const VariableOptions& o);
};
}  // namespace detail

/// True for `Variable<T>`.
template <class X>
inline constexpr bool is_variable_v = false;
template <class T>
inline constexpr bool is_variable_v<Variable<T>> = true;

// ---------------------------------------------------------------------------------------------
// Definitions.

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
      if (state_->aggregation == VariableAggregation::MEAN) total = total / static_cast<T>(copies.size());
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
    const auto all = static_cast<T>(state_->strategy->num_replicas_in_sync());
    for (std::size_t r = 0; r < n; ++r) apply(op, r, per_copy[r] / all);
  } else {
    for (std::size_t r = 0; r < n; ++r) apply(op, r, per_copy[r]);
  }
  if (state_->sharded) return sharded_read();
  return state_->sync_on_read ? aggregate_read() : state_->get(0);
}

template <class T>
template <class V>
Tensor<T> Variable<T>::write(Op op, const char* name, const V& v) {
  if constexpr (is_distributed_v<V>) {
    static_assert(std::is_same_v<typename V::value_type, Tensor<T>>, "assign: PerReplica of Tensor<T> expected");
    const auto place = detail::locate_variable(state_->live_strategy(name), state_->name, name, true);
    MIRRORED_ENFORCE(!place.replica_context && component_ < 0 && state_->strategy, InvalidArgumentError, "Variable '",
                     state_->name, "'.", name,
                     ": a PerReplica value can only be written to a distributed variable in cross-replica context");
    MIRRORED_ENFORCE(!state_->sharded, InvalidArgumentError, "Variable '", state_->name, "'.", name,
                     ": a sharded variable takes one whole value (cut into its replicas' slices), not a PerReplica");
    MIRRORED_ENFORCE(v.size() == state_->components.size(), InvalidArgumentError, "Variable '", state_->name, "'.",
                     name, ": PerReplica value has ", v.size(), " components for ", state_->components.size(),
                     " copies");
    std::vector<Tensor<T>> per_copy;
    for (const auto& t : v.values()) per_copy.push_back(as_tensor(name, t));
    return cross_replica_write(op, name, per_copy);
  } else {
    Tensor<T> t;
    if constexpr (std::is_arithmetic_v<V>)
      t = as_tensor(name, Tensor<T>::scalar(static_cast<T>(v)));
    else
      t = as_tensor(name, v);
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
std::vector<Variable<T>> Strategy::experimental_local_results(const Variable<T>& var) {
  if (!var.strategy() || detail::VariableAccess::component_index(var) >= 0) return {var};
  const int copies = static_cast<int>(var.num_components());
  std::vector<Variable<T>> out;
  out.reserve(static_cast<std::size_t>(copies));
  for (int r = 0; r < copies; ++r) out.push_back(detail::VariableAccess::component(var, r));
  return out;
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
  const Tensor<T> per_copy = divide ? t / static_cast<T>(indices.size()) : t;
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

}  // namespace mirrored
