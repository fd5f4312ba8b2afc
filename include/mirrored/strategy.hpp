#pragma once
/// \file
/// `Strategy`: the distribution API shared by every strategy (run, reduce, gather, scope, …),
/// and the context functions (`get_strategy`, `get_replica_context`, …).

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/nest.hpp"
#include "mirrored/detail/variable_access.hpp"
#include "mirrored/device.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/input_options.hpp"
#include "mirrored/reduce_op.hpp"
#include "mirrored/repr.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {

class Strategy;
class ReplicaContext;
template <class E>
class DistributedDataset;  // distributed_dataset.hpp
namespace data {
template <class E>
class Dataset;  // data/dataset.hpp
}  // namespace data
template <class T>
class Variable;

namespace detail {
struct StrategyRuntime;  // rendezvous, replica threads, run lock, failure record (src/runtime/)
class WorkerStage;       // the cross-worker stage of a multi-worker strategy (src/collectives/worker_stage.hpp)
struct UntypedTensor;
/// Multi-worker strategies: replaces `value` with the chief's (variables take the chief's initial
/// values); nothing for single-process strategies. Collective across workers.
void broadcast_initial_value(Strategy& strategy, UntypedTensor& value);
/// Distributed iterators of several workers (distributed_dataset.hpp): how many of `strategy`'s
/// workers have another input step (`mine`: this worker's answer), in one cross-worker exchange
/// that every worker makes at the same point of its collectives. \throws FailedPreconditionError
/// in replica context; what a cross-worker collective throws.
int count_workers_with_input(Strategy& strategy, bool mine);
/// This worker's input pipeline failed with `error`: the job fails, so that the other workers,
/// waiting in `count_workers_with_input`, get AbortedError naming this worker at once.
void input_failed(Strategy& strategy, const std::exception_ptr& error) noexcept;

/// `Strategy::experimental_distribute_dataset` and `distribute_datasets_from_function` of
/// `strategy`. Defined in <mirrored/distributed_dataset.hpp>, the header of `DistributedDataset`,
/// which a caller includes for the result (the input pipeline's headers include this one).
template <class E>
DistributedDataset<E> distribute_dataset_of(Strategy& strategy, data::Dataset<E> ds, InputOptions o);
template <class Fn>
auto datasets_from_function_of(Strategy& strategy, Fn& dataset_fn, InputOptions o);

/// True while the calling thread runs a replica's function inside `Strategy::run` (for
/// `Variable`'s constructor, which creates a variable per replica only there).
bool in_replica_thread() noexcept;

/// The component of a `run` argument for replica `r` (distributed values are unwrapped).
template <class A>
decltype(auto) replica_arg(A& arg, int r) {
  if constexpr (is_distributed_v<std::remove_cv_t<A>>)
    return arg[static_cast<std::size_t>(r)];
  else
    return (arg);
}
template <class A>
using replica_arg_t = decltype(replica_arg(std::declval<A&>(), 0));

/// What `merge_call` gives each replica back: its own component of a `PerReplica`, else the value.
template <class R>
struct merge_result {
  using type = R;
};
template <class X>
struct merge_result<PerReplica<X>> {
  using type = X;
};
template <class X>
struct merge_result<Mirrored<X>> {
  using type = X;
};
}  // namespace detail

/// Arguments of `experimental_distribute_values_from_function`'s function (read-only, like TF's).
struct ValueContext {
  int replica_id_in_sync_group = 0;
  int num_replicas_in_sync = 1;
};

/// RAII guard returned by `Strategy::scope()`: while alive, the strategy is the current one on
/// this thread and the thread is in its cross-replica context. Move-only.
class [[nodiscard]] Scope {
 public:
  Scope(Scope&& other) noexcept : strategy_(std::exchange(other.strategy_, nullptr)) {}
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Scope& operator=(Scope&&) = delete;
  ~Scope();

 private:
  friend class Strategy;
  explicit Scope(Strategy* s) : strategy_(s) {}
  Strategy* strategy_;
};

/// Lower-level, less commonly used parts of a strategy (TF's `strategy.extended`).
class StrategyExtended {
 public:
  /// The replicas' devices, in replica order (canonical forms).
  const std::vector<Device>& worker_devices() const noexcept;
  /// The cross-device ops the strategy reduces with.
  CrossDeviceOps& cross_device_ops() const noexcept;
  /// Default deadline of collectives and `merge_call` (from `MIRRORED_COLLECTIVE_TIMEOUT_S`,
  /// 1800 s by default); `CommunicationOptions::timeout_seconds` overrides it per call.
  double collective_timeout_seconds() const noexcept;
  /// Sets that default. \throws InvalidArgumentError unless `seconds` > 0.
  void set_collective_timeout_seconds(double seconds);

  /// Number of worker processes whose replicas run in sync (1 except for
  /// `MultiWorkerMirroredStrategy`); `num_replicas_in_sync()` is this times the local replicas.
  int num_workers() const noexcept;
  /// This worker's rank among them: 0 is the chief (TF's `task_id` in rank order, chief first).
  int worker_index() const noexcept;
  /// True where checkpoints should be written: on the chief (every single-process strategy is
  /// its own chief).
  bool should_checkpoint() const noexcept { return worker_index() == 0; }
  /// True where summaries should be written: on the chief.
  bool should_save_summary() const noexcept { return worker_index() == 0; }

  // The variable-level API below: `Variable<T>` is complete wherever a caller has one (these are
  // defined below through `detail::VariableAccess`, which names it through `T` alone).

  /// True when `v` was created in this strategy's scope (or run).
  template <class T>
  bool variable_created_in_scope(const Variable<T>& v) const noexcept;

  /// Calls `fn(component, args_r...)` once per replica copy of `var`, in replica order, on the
  /// calling thread, where `component` is a `Variable<T>&` naming that copy alone (writes
  /// through it bypass aggregation) and `args_r` are the replica's components of distributed
  /// arguments. Returns a `PerReplica` of the results, or nothing. \throws
  /// FailedPreconditionError in replica context or for a variable of another strategy.
  template <class T, class Fn, class... Args>
  auto update(const Variable<T>& var, Fn&& fn, Args&&... args);

  /// Reduces `value` (one tensor per replica) onto every device of `destinations`' copies.
  /// \throws FailedPreconditionError in replica context; InvalidArgumentError on mismatched shapes.
  template <class T>
  Mirrored<Tensor<T>> reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value, const Variable<T>& destinations,
                                const CommunicationOptions& options = {});
  /// Reduces `value` onto one device.
  template <class T>
  Tensor<T> reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value, const Device& destination,
                      const CommunicationOptions& options = {});

  /// `reduce_to` of many values at once, packed into reductions of about
  /// `options.bytes_per_pack` bytes (0: one) so that many small tensors cost few reductions.
  template <class T>
  std::vector<Mirrored<Tensor<T>>> batch_reduce_to(
      ReduceOp op, const std::vector<std::pair<PerReplica<Tensor<T>>, Variable<T>>>& value_destination_pairs,
      const CommunicationOptions& options = {});

 private:
  friend class Strategy;
  explicit StrategyExtended(Strategy& s) : s_(s) {}
  // Reduces value i (one tensor per local replica, `values[i][r]`) onto `destinations[i][r]` (the
  // devices of its destination's copies, or the one device of reduce_to) through the collective
  // plan (errors name `method`). Returns out[i][r].
  std::vector<std::vector<detail::UntypedTensor>> batch_reduce_onto(
      const char* method, ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& values,
      const std::vector<std::vector<Device>>& destinations, const CommunicationOptions& options);
  void require_cross_replica(const char* method) const;
  Strategy& s_;
};

/// The distribution API. Obtain one as `MirroredStrategy` (or the default strategy via
/// `get_strategy()` outside any scope). Not copyable or movable: replica threads refer to it.
class Strategy {
 public:
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;
  virtual ~Strategy();

  /// Number of replicas that run each step in lockstep: this process's replicas times the
  /// number of workers (see `extended().num_workers()`).
  int num_replicas_in_sync() const noexcept { return static_cast<int>(devices_.size()) * num_workers_; }
  /// The lower-level API.
  StrategyExtended& extended() noexcept { return extended_; }
  /// A name for messages, e.g. "MirroredStrategy".
  virtual std::string name() const = 0;
  /// A process-unique id (never reused, unlike the object's address), and a weak handle on it
  /// that expires when the strategy is destroyed: variables keep it to detect that their
  /// strategy is gone.
  std::uint64_t id() const noexcept { return *id_; }
  std::weak_ptr<const std::uint64_t> weak_id() const noexcept { return id_; }

  /// Enters this strategy's scope on the calling thread (re-entering the same strategy is fine).
  /// \throws FailedPreconditionError inside `run` ("Method requires being in cross-replica
  /// context, use get_replica_context().merge_call()") or inside another strategy's scope
  /// ("Mixing different tf.distribute.Strategy objects").
  Scope scope();

  /// Calls `fn` once per replica, concurrently, each on that replica's long-lived thread and in
  /// its replica context. `PerReplica`/`Mirrored` arguments are passed as that replica's
  /// component; others are passed as they are (shared by all replicas, so `fn` must only read
  /// them). Returns `PerReplica<R>` of the results (also for one replica), or nothing.
  /// \throws FailedPreconditionError in replica context or inside `merge_call`;
  /// InvalidArgumentError when a distributed argument has the wrong number of components; the
  /// first exception any replica (or a merge_fn) threw, with its type — the other replicas are
  /// released with AbortedError and the strategy stays usable.
  template <class Fn, class... Args>
  auto run(Fn&& fn, Args&&... args);

  /// Reduces `value` across replicas (and along `axis` when given) into a host (`CPU:0`) result.
  /// `value`: a `PerReplica`/`Mirrored` of tensors, numbers or nests (`std::vector`,
  /// `std::tuple`, `std::map<std::string, …>`) of those. `R` (optional) is the result's element
  /// type. MEAN divides by the number of replicas, or with `axis` by the total number of elements
  /// along `axis` over all replicas. \throws InvalidArgumentError on mismatched shapes or
  /// structures, an out-of-range axis, integer MEAN without a floating `R` (use
  /// `reduce<double>`), or SUM of a non-distributed value with several replicas;
  /// FailedPreconditionError in replica context.
  template <class R = void, class V>
  auto reduce(ReduceOp op, const V& value, std::optional<int> axis);
  /// `reduce` with the op given as "SUM"/"MEAN" (any case).
  template <class R = void, class V>
  auto reduce(std::string_view op, const V& value, std::optional<int> axis) {
    return reduce<R>(parse_reduce_op(op), value, axis);
  }

  /// Concatenates the replicas' tensors along `axis` (negative counts from the end), in replica
  /// order, on the host. \throws InvalidArgumentError for rank-0 components, different ranks,
  /// shapes that differ off `axis`, or an out-of-range axis; FailedPreconditionError in replica
  /// context ("use get_replica_context().all_gather() instead").
  template <class T>
  Tensor<T> gather(const PerReplica<Tensor<T>>& value, int axis);
  /// A non-distributed tensor is returned unchanged.
  template <class T>
  Tensor<T> gather(const Tensor<T>& value, int axis);

  /// The components of a `PerReplica`/`Mirrored` (replica order); `{value}` for anything else.
  template <class V>
  auto experimental_local_results(const V& value);
  /// The per-replica components of a variable, in replica order: one `Variable<T>` per copy,
  /// each naming that copy alone (as `extended().update` passes them: reads give that copy, writes
  /// touch only it). TF returns the component variables too; handles rather than tensors keep
  /// that meaning, and `value()` of each gives the copy's tensor. `{var}` for a plain variable or a
  /// component.
  template <class T>
  std::vector<Variable<T>> experimental_local_results(const Variable<T>& var);

  /// Calls `value_fn(const ValueContext&)` once per replica, in replica order, on the calling
  /// thread, under that replica's device (a tensor it makes without a device is on the replica's
  /// device, as TF runs it under the device's scope), and returns the results as a `PerReplica`.
  template <class Fn>
  auto experimental_distribute_values_from_function(Fn value_fn);

  /// Distributes `ds`, whose elements are global batches, over the replicas: each step gives
  /// every replica its slice of the next global batch (split rule `o.rebatch_policy`), prepared
  /// ahead on a background thread (see docs/data.md). Include <mirrored/distributed_dataset.hpp>.
  /// \throws InvalidArgumentError for unbatched (rank-0) elements with several replicas, bad
  /// `o`, or a FILE auto-shard policy that cannot be applied.
  template <class E>
  DistributedDataset<E> experimental_distribute_dataset(data::Dataset<E> ds, InputOptions o = {});
  /// Calls `dataset_fn(const InputContext&)` per input pipeline (worker, or replica under
  /// PER_REPLICA) and deals its elements whole to the replicas, without rebatching or sharding.
  /// Returns a `DistributedDataset` (include <mirrored/distributed_dataset.hpp>).
  template <class Fn>
  auto distribute_datasets_from_function(Fn dataset_fn, InputOptions o = {});

 protected:
  Strategy(std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> cross_device_ops);
  /// Starts the replica threads (the default strategy runs inline and has none).
  void start_replica_threads();
  /// Replica `r`'s context.
  ReplicaContext& context(int r) noexcept { return *contexts_[static_cast<std::size_t>(r)]; }
  /// Makes this strategy one worker of several: collectives, reductions and variable creation
  /// go through `stage` as well. Called once, by the constructor of a multi-worker strategy,
  /// before any use.
  void attach_workers(std::shared_ptr<detail::WorkerStage> stage);

 private:
  friend class ReplicaContext;
  friend class StrategyExtended;
  friend class Scope;
  friend void detail::broadcast_initial_value(Strategy&, detail::UntypedTensor&);
  friend int detail::count_workers_with_input(Strategy&, bool);
  friend void detail::input_failed(Strategy&, const std::exception_ptr&) noexcept;

  using Body = void (*)(void* ctx, int replica);
  // Runs body(ctx, r) on every replica thread in replica context; rethrows the first failure.
  void execute(Body body, void* ctx);
  // Throws FailedPreconditionError unless the calling thread may call `method` cross-replica.
  void require_cross_replica(const char* method, const char* hint) const;
  void require_not_in_merge(const char* method) const;
  void record_failure(int replica, std::exception_ptr error) noexcept;
  template <class V>
  void check_components(const char* op, const V& value) const;
  // Throws InvalidArgumentError naming `op` unless a distributed value of `count` components fits.
  void check_component_count(const char* op, std::size_t count) const;
  template <class R, class X>
  auto reduce_values(ReduceOp op, const std::vector<X>& values, std::optional<int> axis);

  // Reduces the replicas' leaves (`leaves[r]`, `structures[r]`), first converted to `as` when given.
  std::vector<detail::UntypedTensor> reduce_flat(ReduceOp op, std::vector<std::vector<detail::UntypedTensor>>& leaves,
                                                 const std::vector<std::string>& structures, std::optional<int> axis,
                                                 std::optional<DType> as);
  detail::UntypedTensor gather_flat(const std::vector<detail::UntypedTensor>& parts, int axis) const;

  std::vector<Device> devices_;  // this process's replicas
  int num_workers_ = 1;
  int worker_index_ = 0;
  std::shared_ptr<CrossDeviceOps> cross_device_ops_;
  StrategyExtended extended_{*this};
  // Held through a pointer so that user code does not compile the threading machinery.
  std::unique_ptr<detail::StrategyRuntime> rt_;
  std::vector<std::unique_ptr<ReplicaContext>> contexts_;
  std::shared_ptr<const std::uint64_t> id_;  // from a process-wide counter; see weak_id()
};

/// The current strategy: the one whose `run` or scope the calling thread is in, else the default
/// strategy (one replica on CPU:0, runs inline).
Strategy& get_strategy();
/// True when the current strategy is not the default one.
bool has_strategy();
/// True inside a strategy's scope or a merge_fn, outside `run`.
bool in_cross_replica_context();
/// The calling replica's context inside `run`; nullptr in cross-replica context; the default
/// replica context outside any scope.
ReplicaContext* get_replica_context();

// ---------------------------------------------------------------------------------------------
// Template definitions.

template <class V>
void Strategy::check_components(const char* op, const V& value) const {
  if constexpr (is_distributed_v<V>) check_component_count(op, value.size());
}

template <class Fn, class... Args>
auto Strategy::run(Fn&& fn, Args&&... args) {
  require_cross_replica("run", "");
  require_not_in_merge("run");
  (check_components("run", args), ...);
  static_assert(std::is_invocable_v<Fn&, detail::replica_arg_t<std::remove_reference_t<Args>>...>,
                "Strategy::run: fn cannot be called with the arguments as each replica sees them: a PerReplica<X> "
                "or Mirrored<X> argument is passed as one X, so a dataset element that is a std::tuple is ONE "
                "argument (take it as one parameter and unpack it, or pass its parts to run separately)");
  Scope entered = scope();
  using R = std::invoke_result_t<Fn&, detail::replica_arg_t<std::remove_reference_t<Args>>...>;
  if constexpr (std::is_void_v<R>) {
    auto body = [&](int r) {
      (void)r;  // unused when there are no arguments
      std::invoke(fn, detail::replica_arg(args, r)...);
    };
    execute([](void* c, int r) { (*static_cast<decltype(body)*>(c))(r); }, &body);
  } else {
    using Out = std::decay_t<R>;
    std::vector<std::optional<Out>> slots(devices_.size());
    auto body = [&](int r) {
      slots[static_cast<std::size_t>(r)].emplace(std::invoke(fn, detail::replica_arg(args, r)...));
    };
    execute([](void* c, int r) { (*static_cast<decltype(body)*>(c))(r); }, &body);
    std::vector<Out> values;
    values.reserve(slots.size());
    for (auto& s : slots) values.push_back(std::move(*s));
    return PerReplica<Out>(std::move(values));
  }
}

template <class R, class X>
auto Strategy::reduce_values(ReduceOp op, const std::vector<X>& values, std::optional<int> axis) {
  static_assert(detail::is_nest<X>(), "reduce: values must be tensors, numbers or nests of them");
  using Out = detail::rebind_nest_t<X, R>;
  if (op == ReduceOp::MEAN && detail::nest_has_integer_leaf<Out>()) {
    throw InvalidArgumentError(
        "reduce: MEAN of integer values has no exact integer result; call reduce<double>(...) to get a "
        "float64 result (as TF does)");
  }
  std::vector<std::vector<detail::UntypedTensor>> leaves(values.size());
  std::vector<std::string> structures(values.size());
  for (std::size_t r = 0; r < values.size(); ++r) detail::flatten(values[r], leaves[r], structures[r]);
  std::optional<DType> as;
  if constexpr (!std::is_void_v<R>) as = dtype_of<R>();
  std::vector<detail::UntypedTensor> out = reduce_flat(op, leaves, structures, axis, as);
  std::size_t i = 0;
  return detail::unflatten<Out>(values[0], out, i);
}

template <class R, class V>
auto Strategy::reduce(ReduceOp op, const V& value, std::optional<int> axis) {
  require_cross_replica("reduce", "");
  if constexpr (is_distributed_v<V>) {
    check_components("reduce", value);
    return reduce_values<R>(op, value.values(), axis);
  } else {
    static_assert(detail::is_nest<V>(), "reduce: values must be tensors, numbers or nests of them");
    if (op == ReduceOp::SUM && num_replicas_in_sync() > 1) {
      throw InvalidArgumentError("A non-DistributedValues value " + repr(value) +
                                 " cannot be reduced with the given reduce op ReduceOp.SUM.");
    }
    using Out = detail::rebind_nest_t<V, R>;
    if constexpr (std::is_same_v<Out, V>) {
      if (op == ReduceOp::MEAN && !axis) return value;  // the mean of identical copies
    }
    // One replica, a MEAN along an axis, or a type change: the value is its own only component.
    return reduce_values<R>(op, std::vector<V>{value}, axis);
  }
}

template <class T>
Tensor<T> Strategy::gather(const PerReplica<Tensor<T>>& value, int axis) {
  require_cross_replica("gather", "requires cross-replica context, use get_replica_context().all_gather() instead");
  check_components("gather", value);
  std::vector<detail::UntypedTensor> parts;
  parts.reserve(value.size());
  for (const auto& t : value.values()) parts.push_back(detail::TensorAccess::erase(t));
  return detail::TensorAccess::restore<T>(gather_flat(parts, axis));
}

template <class T>
Tensor<T> Strategy::gather(const Tensor<T>& value, int /*axis*/) {
  require_cross_replica("gather", "requires cross-replica context, use get_replica_context().all_gather() instead");
  return value;
}

template <class V>
auto Strategy::experimental_local_results(const V& value) {
  if constexpr (is_distributed_v<V>)
    return value.values();
  else
    return std::vector<V>{value};
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

template <class Fn>
auto Strategy::experimental_distribute_values_from_function(Fn value_fn) {
  using Out = std::decay_t<std::invoke_result_t<Fn&, const ValueContext&>>;
  // One value per local replica; ids are global (this worker's replicas follow the earlier workers').
  std::vector<Out> values;
  values.reserve(devices_.size());
  const int local = static_cast<int>(devices_.size());
  for (int r = 0; r < local; ++r) {
    const detail::DefaultDeviceScope on(devices_[static_cast<std::size_t>(r)]);
    values.push_back(value_fn(ValueContext{worker_index_ * local + r, num_replicas_in_sync()}));
  }
  return PerReplica<Out>(std::move(values));
}

template <class E>
DistributedDataset<E> Strategy::experimental_distribute_dataset(data::Dataset<E> ds, InputOptions o) {
  return detail::distribute_dataset_of(*this, std::move(ds), o);
}

template <class Fn>
auto Strategy::distribute_datasets_from_function(Fn dataset_fn, InputOptions o) {
  return detail::datasets_from_function_of(*this, dataset_fn, o);
}

template <class T>
bool StrategyExtended::variable_created_in_scope(const Variable<T>& v) const noexcept {
  return detail::VariableAccess::state(v).belongs_to(&s_);
}

template <class T, class Fn, class... Args>
auto StrategyExtended::update(const Variable<T>& var, Fn&& fn, Args&&... args) {
  require_cross_replica("update");
  (s_.check_components("update", args), ...);
  Strategy* owner = detail::VariableAccess::state(var).live_strategy("update");
  if (owner != &s_) {
    throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: StrategyExtended::update of " +
                                  s_.name() + " was given variable '" + var.name() + "' of " +
                                  (owner ? owner->name() : std::string("no strategy")));
  }
  const int n = static_cast<int>(worker_devices().size());  // this process's copies
  using R = std::invoke_result_t<Fn&, Variable<T>&, detail::replica_arg_t<std::remove_reference_t<Args>>...>;
  if constexpr (std::is_void_v<R>) {
    for (int r = 0; r < n; ++r) {
      Variable<T> component = detail::VariableAccess::component(var, r);
      std::invoke(fn, component, detail::replica_arg(args, r)...);
    }
  } else {
    std::vector<std::decay_t<R>> out;
    for (int r = 0; r < n; ++r) {
      Variable<T> component = detail::VariableAccess::component(var, r);
      out.push_back(std::invoke(fn, component, detail::replica_arg(args, r)...));
    }
    return PerReplica<std::decay_t<R>>(std::move(out));
  }
}

template <class T>
Tensor<T> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value, const Device& destination,
                                      const CommunicationOptions& options) {
  require_cross_replica("reduce_to");
  s_.check_components("reduce_to", value);
  std::vector<std::vector<detail::UntypedTensor>> values(1);
  for (const auto& t : value.values()) values[0].push_back(detail::TensorAccess::erase(t));
  return detail::TensorAccess::restore<T>(batch_reduce_onto("reduce_to", op, values, {{destination}}, options)[0][0]);
}

template <class T>
Mirrored<Tensor<T>> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value,
                                                const Variable<T>& destinations, const CommunicationOptions& options) {
  return batch_reduce_to<T>(op, {{value, destinations}}, options)[0];
}

template <class T>
std::vector<Mirrored<Tensor<T>>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<Tensor<T>>, Variable<T>>>& value_destination_pairs,
    const CommunicationOptions& options) {
  require_cross_replica("batch_reduce_to");
  std::vector<std::vector<detail::UntypedTensor>> values;
  values.reserve(value_destination_pairs.size());
  for (const auto& [value, destination] : value_destination_pairs) {
    s_.check_components("batch_reduce_to", value);
    auto& parts = values.emplace_back();
    for (const auto& t : value.values()) parts.push_back(detail::TensorAccess::erase(t));
  }
  std::vector<std::vector<Device>> destinations;
  destinations.reserve(value_destination_pairs.size());
  for (const auto& [value, destination] : value_destination_pairs) {
    auto& devices = destinations.emplace_back();
    for (const auto& c : destination.components()) devices.push_back(c.device());
  }
  const auto reduced = batch_reduce_onto("batch_reduce_to", op, values, destinations, options);
  std::vector<Mirrored<Tensor<T>>> out;
  out.reserve(reduced.size());
  for (const auto& copies_erased : reduced) {
    std::vector<Tensor<T>> copies;
    copies.reserve(copies_erased.size());
    for (const auto& c : copies_erased) copies.push_back(detail::TensorAccess::restore<T>(c));
    out.emplace_back(std::move(copies));
  }
  return out;
}

}  // namespace mirrored
