#pragma once
/// \file
/// `Variable<T>`: state that stays identical on every replica (mirrored), or that each replica
/// keeps for itself and that is aggregated when read (sync-on-read).

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/detail/variable_access.hpp"
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
  friend std::ostream& operator<<(std::ostream& os, const Variable& v) { return detail::write_text(os, v.to_string()); }

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

  // `assign*` of any accepted value type: a whole value (`write_tensor`) or, for a `PerReplica`,
  // one value per copy (`write_per_replica`); both compiled for every element type.
  template <class V>
  Tensor<T> write(Op op, const char* name, const V& v);
  Tensor<T> write_tensor(Op op, const char* name, const Tensor<T>& v);
  Tensor<T> write_per_replica(Op op, const char* name, const std::vector<Tensor<T>>& values);
  std::function<void()> prepare_assign(const Tensor<T>& value) const;
  // Sharded variables: the whole value gathered from the slices, and `value` cut into them (one
  // per copy, on its device).
  Tensor<T> sharded_read() const;
  std::vector<Tensor<T>> sharded_pieces(const Tensor<T>& value) const;

  std::shared_ptr<detail::VariableState<T>> state_;
  int component_ = -1;  // >= 0: a view of that copy alone (see StrategyExtended::update)
};

/// True for `Variable<T>`.
template <class X>
inline constexpr bool is_variable_v = false;
template <class T>
inline constexpr bool is_variable_v<Variable<T>> = true;

// ---------------------------------------------------------------------------------------------
// The members are compiled once for every element type (src/variables/variable_members.cpp);
// only the dispatch on the value type of `assign*` is a template here.

template <class T>
template <class V>
Tensor<T> Variable<T>::write(Op op, const char* name, const V& v) {
  if constexpr (is_distributed_v<V>) {
    static_assert(std::is_same_v<typename V::value_type, Tensor<T>>, "assign: PerReplica of Tensor<T> expected");
    return write_per_replica(op, name, v.values());
  } else if constexpr (std::is_arithmetic_v<V>) {
    return write_tensor(op, name, Tensor<T>::scalar(static_cast<T>(v)));
  } else {
    return write_tensor(op, name, v);
  }
}

extern template class Variable<float>;
extern template class Variable<double>;
extern template class Variable<int32_t>;
extern template class Variable<int64_t>;
extern template class Variable<uint8_t>;
extern template class Variable<float16>;
extern template class Variable<bfloat16>;

}  // namespace mirrored
