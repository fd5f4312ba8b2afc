#pragma once
/// \file
/// `ReplicaContext`: what a replica function can do with the other replicas (all-reduce,
/// all-gather, merge_call).

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/nest.hpp"
#include "mirrored/pending_collective.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored {

namespace detail {
/// What a replica posts in `merge_call`: its arguments, and where merge_fn's result goes (replica
/// 0 runs merge_fn and fills its own slot; every replica reads replica 0's). Replicas must post
/// the same instantiation, which `merge_call` checks before anyone reads another's post.
template <class R, class... Args>
struct MergePost {
  using Result = std::optional<std::conditional_t<std::is_void_v<R>, char, R>>;
  std::tuple<const Args*...> args;
  Result* result;
};
inline int local_replica_index(const ReplicaContext& ctx) noexcept;
struct OptimizerStep;
void apply_optimizer_step(ReplicaContext* ctx, OptimizerStep& step);
void agree_on_variables(ReplicaContext& ctx, const char* op, const std::vector<const void*>& ids,
                        const std::vector<std::string>& names);
class AsyncRunner;
}  // namespace detail

/// The context of one replica inside `Strategy::run` (or the default replica context outside any
/// scope). Valid only on the thread and during the `run` it belongs to.
class ReplicaContext {
 public:
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;

  /// This replica's index, 0 … num_replicas_in_sync()-1 (with several workers: global, this
  /// worker's replicas after those of the workers before it in rank order).
  int replica_id_in_sync_group() const noexcept {
    return strategy_->extended().worker_index() * static_cast<int>(strategy_->extended().worker_devices().size()) +
           replica_id_;
  }
  int num_replicas_in_sync() const noexcept { return strategy_->num_replicas_in_sync(); }
  Strategy& strategy() const noexcept { return *strategy_; }

  /// Every replica receives the same reduction of all replicas' `value` (a tensor, a number or a
  /// nest of them), summed in replica order. All replicas must call it, in the same order as
  /// their other collectives. \throws InvalidArgumentError when replicas pass different reduce
  /// ops, nest structures (vector sizes, map keys), dtypes, shapes or
  /// `CommunicationOptions::bytes_per_pack` (every replica, naming both replicas and both values,
  /// before any data moves), or for MEAN of integers; FailedPreconditionError when replicas call
  /// different collectives or one returns without calling it, or outside this context's `run`;
  /// DeadlineExceededError when a replica does not arrive in time; AbortedError when another
  /// replica failed.
  template <class V>
  V all_reduce(ReduceOp op, const V& value, const CommunicationOptions& options = {});
  /// `all_reduce` with the op given as "SUM"/"MEAN" (any case).
  template <class V>
  V all_reduce(std::string_view op, const V& value, const CommunicationOptions& options = {}) {
    return all_reduce(parse_reduce_op(op), value, options);
  }

  /// `all_reduce` that returns at once: the reduction runs beside the replica's computation (CPU
  /// replicas: on a communication thread of the library, one per replica; GPUs: on the device's
  /// communication stream, ordered after the work that produced `value` by an event), and
  /// `PendingCollective::wait()` gives the result, bitwise equal to `all_reduce`'s. Every replica
  /// issues its asynchronous collectives in the same order as each other and as its synchronous
  /// ones (a synchronous collective first lets the replica's pending ones start); results may be
  /// waited for in any order. The deadline (`timeout_seconds`) counts from this call and is
  /// enforced by the strategy's watchdog even while nobody waits. A tensor of `value` that nothing
  /// else refers to (moved in, or a temporary) is scratch: it may be reduced in place and returned
  /// as the result's storage. Mismatches, deadlines and failures of other replicas surface from
  /// `wait()`; \throws (here) InvalidArgumentError for MEAN of integers or bad `options`,
  /// FailedPreconditionError outside this context's `run`.
  template <class V>
  PendingCollective<V> all_reduce_async(ReduceOp op, V value, const CommunicationOptions& options = {});

  /// Reduce-scatter (beyond TF; docs/api.md §13): every replica passes a tensor of the same shape, of rank
  /// >= 1; replica r (`replica_id_in_sync_group()`, across every worker) receives slice r of the
  /// reduction's rows (axis 0), cut by the BALANCED rule of `experimental_distribute_dataset`:
  /// `floor = rows / N` rows each, and one more for the first `rows - N * floor` slices (a slice
  /// may have 0 rows). Summed in replica order, as `all_reduce`, so concatenating every replica's
  /// result along axis 0 (`all_gather(result, 0)`) gives `all_reduce(op, value)` bit for bit.
  /// `options.compression` applies across workers. Same errors as `all_reduce`, plus
  /// InvalidArgumentError for a rank-0 value.
  template <class T>
  Tensor<T> reduce_scatter(ReduceOp op, const Tensor<T>& value, const CommunicationOptions& options = {});

  /// `reduce_scatter` that returns at once, as `all_reduce_async` (same lanes, same order, the
  /// deadline counted from this call); `wait()` gives this replica's slice, bitwise equal to
  /// `reduce_scatter`'s. \throws (here) what `all_reduce_async` throws here, and
  /// InvalidArgumentError for a rank-0 value.
  template <class T>
  PendingCollective<Tensor<T>> reduce_scatter_async(ReduceOp op, Tensor<T> value,
                                                    const CommunicationOptions& options = {});

  /// Every replica receives the concatenation of all replicas' `value` along `axis`, in replica
  /// order (sizes along `axis` may differ). Same errors as `all_reduce`, plus
  /// InvalidArgumentError when replicas pass different dtypes or axes (`-1` and `rank - 1` are the
  /// same axis), for rank-0 values, different ranks, shapes that differ off `axis`, or an
  /// out-of-range axis.
  template <class T>
  Tensor<T> all_gather(const Tensor<T>& value, int axis, const CommunicationOptions& options = {});

  /// Pauses all replicas and calls `merge_fn(strategy, PerReplica<Args>...)` once, on replica
  /// 0's thread, in cross-replica context; every replica receives the result (its own component
  /// when the result is a `PerReplica`/`Mirrored`). An exception from `merge_fn` surfaces from
  /// `run` with its type. Inside `merge_fn`, `in_cross_replica_context()` is true and
  /// `get_replica_context()` is null. With several workers (as in TF) `merge_fn` runs once per
  /// worker, on that worker's replicas' values; what it calls on the strategy (`reduce`, `gather`,
  /// `extended().batch_reduce_to`, …) spans every worker. Same synchronisation errors as
  /// `all_reduce`; \throws InvalidArgumentError when replicas pass arguments of different types or
  /// merge_fns with different result types (only replica 0's merge_fn runs, as in TF).
  template <class Fn, class... Args>
  auto merge_call(Fn&& merge_fn, const Args&... args);

 private:
  friend class Strategy;
  friend class detail::AsyncRunner;
  friend int detail::local_replica_index(const ReplicaContext& ctx) noexcept;
  friend void detail::apply_optimizer_step(ReplicaContext* ctx, detail::OptimizerStep& step);
  friend void detail::agree_on_variables(ReplicaContext& ctx, const char* op, const std::vector<const void*>& ids,
                                         const std::vector<std::string>& names);
  ReplicaContext(Strategy& strategy, int replica_id) : strategy_(&strategy), replica_id_(replica_id) {}

  // Throws FailedPreconditionError unless the calling thread is inside this context's run.
  void check_active(const char* op) const;
  // The call's one deadline: `options.timeout_seconds` (else the strategy's) from now, once the
  // options are checked (a positive timeout, a pack size >= 0).
  Deadline deadline(const CommunicationOptions& options) const;
  // Joins a collective and validates that every replica posted matching leaves; returns the
  // reduction of each leaf of `in`, in new tensors.
  std::vector<detail::UntypedTensor> all_reduce_flat(ReduceOp op, const std::vector<detail::UntypedTensor>& in,
                                                     const std::string& structure, const CommunicationOptions& options);
  // The synchronous reduce-scatter of `in`: this replica's slice.
  detail::UntypedTensor reduce_scatter_flat(ReduceOp op, const detail::UntypedTensor& in,
                                            const CommunicationOptions& options);
  // The joined part of every reduction, synchronous or not, through the collective plan:
  // `request.kind` is all_reduce or reduce_scatter, or their asynchronous twins (from a lane).
  // `flight_seq`: an asynchronous call's flight-recorder entry, made when it was issued.
  void joined(const CollectiveRequest& request, const Deadline& deadline, uint64_t flight_seq = 0);
  // Issues an asynchronous all-reduce (`reduce_scatter` false) or reduce-scatter of `in`;
  // `scratch[i]`: nothing but the caller refers to leaf i.
  std::shared_ptr<detail::AsyncCollective> issue_async(bool reduce_scatter, ReduceOp op,
                                                       std::vector<detail::UntypedTensor> in,
                                                       const std::vector<char>& scratch, std::string structure,
                                                       const CommunicationOptions& options);
  // An optimizer step of this replica through the collective plan (detail::apply_optimizer_step).
  void optimizer_step(detail::OptimizerStep& step);
  // detail::agree_on_variables: the rendezvous of every replica comparing the variables of `op`.
  void agree_on_variables(const char* op, const std::vector<const void*>& ids, const std::vector<std::string>& names);
  // A reduction's checks where it is called: MEAN of integers (op `name`).
  void check_mean_of(const char* name, ReduceOp op, bool integer) const;
  // An asynchronous collective's error that nobody waited for fails this replica's run.
  void record_async_failure(std::exception_ptr error) noexcept;
  // Lets this replica's pending asynchronous collectives join their rendezvous and finish before
  // a synchronous one joins (every replica issues them in the same order).
  void drain_async() noexcept;
  std::vector<detail::UntypedTensor> all_gather_flat(const detail::UntypedTensor& in, int axis,
                                                     const CommunicationOptions& options);
  // merge_call's rendezvous: `run_merge` is called on replica 0 with every replica's payload,
  // then every replica calls `take` with replica 0's payload to copy out its result.
  // `signature` is the type `payload` points to; replicas whose types differ are rejected before
  // anyone reads another's payload.
  using MergeFn = void (*)(void* ctx, const std::vector<const void*>& payloads);
  using TakeFn = void (*)(void* ctx, const void* first_payload);
  void merge_flat(const void* payload, const std::type_info& signature, MergeFn run_merge, void* merge_ctx, TakeFn take,
                  void* take_ctx);

  Strategy* strategy_;
  int replica_id_;  // among this process's replicas
};

namespace detail {
/// The index of `ctx`'s replica among this process's replicas (its component of distributed
/// values and variables); equals `replica_id_in_sync_group()` with one worker.
inline int local_replica_index(const ReplicaContext& ctx) noexcept { return ctx.replica_id_; }
}  // namespace detail

template <class V>
V ReplicaContext::all_reduce(ReduceOp op, const V& value, const CommunicationOptions& options) {
  static_assert(detail::is_nest<V>(), "all_reduce: values must be tensors, numbers or nests of them");
  check_active("all_reduce");
  check_mean_of("all_reduce", op, detail::nest_has_integer_leaf<V>());
  std::vector<detail::UntypedTensor> in;
  std::string structure;
  detail::flatten(value, in, structure);
  const std::vector<detail::UntypedTensor> out = all_reduce_flat(op, in, structure, options);
  std::size_t i = 0;
  return detail::unflatten<V>(value, out, i);
}

template <class V>
PendingCollective<V> ReplicaContext::all_reduce_async(ReduceOp op, V value, const CommunicationOptions& options) {
  static_assert(detail::is_nest<V>(), "all_reduce_async: values must be tensors, numbers or nests of them");
  check_active("all_reduce_async");
  check_mean_of("all_reduce_async", op, detail::nest_has_integer_leaf<V>());
  std::vector<detail::UntypedTensor> in;
  std::string structure;
  detail::flatten(value, in, structure);
  // Held only by `value` (ours) and `in`: nobody else can observe the storage, so it is scratch.
  // (A tensor that appears twice in the nest is held more often and is never reduced in place.)
  std::vector<char> scratch(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) scratch[i] = in[i].storage && in[i].storage.use_count() <= 2;
  auto job = issue_async(false, op, std::move(in), scratch, std::move(structure), options);
  return PendingCollective<V>(std::move(job), std::move(value));
}

template <class T>
Tensor<T> ReplicaContext::reduce_scatter(ReduceOp op, const Tensor<T>& value, const CommunicationOptions& options) {
  check_active("reduce_scatter");
  check_mean_of("reduce_scatter", op, std::is_integral_v<T>);
  return detail::TensorAccess::restore<T>(reduce_scatter_flat(op, detail::TensorAccess::erase(value), options));
}

template <class T>
PendingCollective<Tensor<T>> ReplicaContext::reduce_scatter_async(ReduceOp op, Tensor<T> value,
                                                                  const CommunicationOptions& options) {
  check_active("reduce_scatter_async");
  check_mean_of("reduce_scatter_async", op, std::is_integral_v<T>);
  auto job = issue_async(true, op, {detail::TensorAccess::erase(value)}, {0}, std::string(), options);
  return PendingCollective<Tensor<T>>(std::move(job), std::move(value));
}

template <class T>
Tensor<T> ReplicaContext::all_gather(const Tensor<T>& value, int axis, const CommunicationOptions& options) {
  check_active("all_gather");
  return detail::TensorAccess::restore<T>(all_gather_flat(detail::TensorAccess::erase(value), axis, options)[0]);
}

template <class Fn, class... Args>
auto ReplicaContext::merge_call(Fn&& merge_fn, const Args&... args) {
  check_active("merge_call");
  using R = std::decay_t<std::invoke_result_t<Fn&, Strategy&, const PerReplica<Args>&...>>;
  using Post = detail::MergePost<R, Args...>;
  typename Post::Result result;  // set on replica 0 only, by merge_fn
  const Post post{{&args...}, &result};
  struct Merge {
    Fn* fn;
    Strategy* strategy;
  } merge{&merge_fn, strategy_};

  auto run_merge = [](void* ctx, const std::vector<const void*>& payloads) {
    auto* m = static_cast<Merge*>(ctx);
    auto per_replica = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
      using A = std::tuple_element_t<K, std::tuple<Args...>>;
      std::vector<A> parts;
      parts.reserve(payloads.size());
      for (const void* p : payloads) parts.push_back(*std::get<K>(static_cast<const Post*>(p)->args));
      return PerReplica<A>(std::move(parts));
    };
    typename Post::Result& out = *static_cast<const Post*>(payloads[0])->result;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      if constexpr (std::is_void_v<R>) {
        std::invoke(*m->fn, *m->strategy, per_replica(std::integral_constant<std::size_t, K>{})...);
        out.emplace('\0');
      } else {
        out.emplace(std::invoke(*m->fn, *m->strategy, per_replica(std::integral_constant<std::size_t, K>{})...));
      }
    }
    (std::index_sequence_for<Args...>{});
  };
  using Out = std::conditional_t<std::is_void_v<R>, char, typename detail::merge_result<R>::type>;
  std::optional<Out> out;
  struct Take {
    std::optional<Out>* out;
    int replica;
  } take{&out, replica_id_};
  auto take_fn = [](void* ctx, const void* first) {
    auto* t = static_cast<Take*>(ctx);
    if constexpr (std::is_void_v<R>) {
      t->out->emplace('\0');
    } else {
      const R& value = **static_cast<const Post*>(first)->result;
      if constexpr (is_distributed_v<R>)
        t->out->emplace(value[static_cast<std::size_t>(t->replica)]);
      else
        t->out->emplace(value);
    }
  };
  merge_flat(&post, typeid(Post), run_merge, &merge, take_fn, &take);
  if constexpr (!std::is_void_v<R>) return std::move(*out);
}

}  // namespace mirrored
