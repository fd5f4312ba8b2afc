#include "mirrored/strategy.hpp"

#include <algorithm>
#include <atomic>

#include "collectives/collective_helpers.hpp"
#include "collectives/ops_selection.hpp"
#include "collectives/worker_stage.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "mirrored/replica_context.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/nest_structure.hpp"
#include "runtime/strategy_runtime.hpp"
#include "runtime/thread_state.hpp"
#include "util/exceptions.hpp"
#include "util/log.hpp"
#include "util/timeline.hpp"

namespace mirrored {
namespace {

using detail::str_cat;

constexpr const char* kCrossReplicaHint =
    "Method requires being in cross-replica context, use get_replica_context().merge_call()";

bool is_aborted(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const AbortedError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// `axis` made non-negative for replica `r`'s value, of rank `rank` (replicas' ranks may differ).
int normalize_axis(int axis, int64_t rank, std::size_t r) {
  MIRRORED_ENFORCE(
      axis >= -rank &&
              axis<rank, InvalidArgumentError, "`axis` = ", axis, " out of range for `value` with rank ", rank, r> 0
          ? str_cat(" (replica ", r, "'s value)")
          : "");
  return axis < 0 ? static_cast<int>(axis + rank) : axis;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Scope and StrategyExtended.

Scope::~Scope() {
  if (!strategy_) return;
  auto& scopes = detail::thread_state().scopes;
  auto it = std::find(scopes.rbegin(), scopes.rend(), strategy_);
  if (it != scopes.rend()) scopes.erase(std::next(it).base());
}

const std::vector<Device>& StrategyExtended::worker_devices() const noexcept { return s_.devices_; }
CrossDeviceOps& StrategyExtended::cross_device_ops() const noexcept { return *s_.cross_device_ops_; }
double StrategyExtended::collective_timeout_seconds() const noexcept {
  return s_.rt_->collective_timeout_s.load(std::memory_order_relaxed);
}
void StrategyExtended::set_collective_timeout_seconds(double seconds) {
  MIRRORED_ENFORCE(seconds > 0, InvalidArgumentError, "set_collective_timeout_seconds: timeout must be positive, got ",
                   seconds);
  s_.rt_->collective_timeout_s.store(seconds, std::memory_order_relaxed);
}
int StrategyExtended::num_workers() const noexcept { return s_.num_workers_; }
int StrategyExtended::worker_index() const noexcept { return s_.worker_index_; }

namespace detail {

void broadcast_initial_value(Strategy& strategy, UntypedTensor& value) {
  if (WorkerStage* workers = strategy.rt_->workers.get()) {
    try {
      workers->broadcast(value, strategy.extended().collective_timeout_seconds());
    } catch (...) {
      workers->local_failure(std::current_exception());
      throw;
    }
  }
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Strategy.

Strategy::Strategy(std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> cross_device_ops)
    : devices_(std::move(devices)),
      cross_device_ops_(cross_device_ops ? std::move(cross_device_ops) : detail::select_cross_device_ops(devices_)),
      rt_(std::make_unique<detail::StrategyRuntime>(static_cast<int>(devices_.size()),
                                                    detail::env_positive("MIRRORED_COLLECTIVE_TIMEOUT_S", 1800.0),
                                                    detail::env_positive("MIRRORED_STALL_WARN_S", 60.0))) {
  contexts_.reserve(devices_.size());
  for (int r = 0; r < static_cast<int>(devices_.size()); ++r)
    contexts_.push_back(std::unique_ptr<ReplicaContext>(new ReplicaContext(*this, r)));
  static std::atomic<std::uint64_t> next_id{1};
  id_ = std::make_shared<const std::uint64_t>(next_id.fetch_add(1, std::memory_order_relaxed));
  (void)detail::timeline::enabled();  // MIRRORED_TIMELINE is read when the first strategy is made
}

Strategy::~Strategy() = default;

void Strategy::start_replica_threads() {
  std::vector<std::string> names;
  for (std::size_t r = 0; r < devices_.size(); ++r)
    names.push_back(str_cat("replica ", r, " (", devices_[r].short_name(), ")"));
  rt_->pool = std::make_unique<detail::ReplicaPool>(static_cast<int>(devices_.size()), std::move(names));
}

void Strategy::attach_workers(std::shared_ptr<detail::WorkerStage> stage) {
  num_workers_ = stage->num_workers();
  worker_index_ = stage->worker_index();
  rt_->workers = std::move(stage);
}

Scope Strategy::scope() {
  auto& ts = detail::thread_state();
  if (ts.replica && !detail::is_default_context(ts.replica)) {
    throw FailedPreconditionError(
        str_cat(name(), "::scope on replica ", ts.replica->replica_id_in_sync_group(), ": ", kCrossReplicaHint));
  }
  Strategy* current = ts.merge ? ts.merge : (ts.scopes.empty() ? nullptr : ts.scopes.back());
  if (current == static_cast<Strategy*>(&detail::default_strategy())) current = nullptr;
  if (current && current != this) {
    throw FailedPreconditionError(str_cat("Mixing different tf.distribute.Strategy objects: entering the scope of a ",
                                          name(), " inside the scope of another ", current->name()));
  }
  ts.scopes.push_back(this);
  return Scope(this);
}

void Strategy::require_cross_replica(const char* method, const char* hint) const {
  const auto& ts = detail::thread_state();
  if (ts.replica && !detail::is_default_context(ts.replica)) {
    throw FailedPreconditionError(str_cat(name(), "::", method, " called on replica ",
                                          ts.replica->replica_id_in_sync_group(), ": ",
                                          *hint ? hint : kCrossReplicaHint));
  }
}

void Strategy::require_not_in_merge(const char* method) const {
  MIRRORED_ENFORCE(detail::thread_state().merge == nullptr, FailedPreconditionError, name(), "::", method,
                   " cannot be called inside a merge_call's merge_fn (the replicas are paused inside the current run)");
}

void Strategy::record_failure(int replica, std::exception_ptr error) noexcept {
  std::string reason;
  {
    // The first failure wins, except that an AbortedError is only ever a consequence of another
    // failure (which may be recorded a moment later by its own replica). Each replica inspects
    // only its own exception, under the lock, and the stored one is judged by its flag: no
    // thread reads another's exception object while its owner may be releasing it.
    std::lock_guard lock(rt_->failure_mu);
    reason = detail::describe_exception(error);
    const bool aborted = is_aborted(error);
    if (!rt_->first_failure || (rt_->first_failure_aborted && !aborted)) {
      std::exception_ptr replaced = std::exchange(rt_->first_failure, error);
      rt_->first_failure_aborted = aborted;
    }
  }
  rt_->group.abort(str_cat("replica ", replica, " failed, so this collective was aborted: ", reason));
}

void Strategy::execute(Body body, void* ctx) {
  std::lock_guard run_lock(rt_->run_mu);
  rt_->group.begin_run();
  rt_->first_failure = nullptr;
  rt_->first_failure_aborted = false;
  struct Call {
    Strategy* self;
    Body body;
    void* ctx;
    std::int64_t step;
  } call{this, body, ctx, rt_->runs++};
  auto task = [](void* c, int r) noexcept {
    auto* call = static_cast<Call*>(c);
    Strategy* self = call->self;
    auto& ts = detail::thread_state();
    ReplicaContext* saved = ts.replica;
    ts.replica = self->contexts_[r].get();
    try {
      // The run's event: from the hand-out (or the end of this replica's previous run event, if
      // later) to just after the replica's signal that its part is done. The pool stamps the first
      // and commits the event after the second (or `execute` below, for the default strategy), so
      // no clock read or append delays the caller. Replica threads were named when the pool
      // started them; the default strategy runs on the caller's thread, which keeps its own name.
      detail::timeline::DeferredSpan trace("run", "run");
      trace.arg("step", call->step);
      trace.arg("replica", r);
      // A GPU replica's device is current on its thread, for users' own kernels.
      if (const Device& d = self->devices_[r]; !d.is_host()) detail::gpu_runtime().enter_device(d);
      call->body(call->ctx, r);
    } catch (...) {
      self->record_failure(r, std::current_exception());
    }
    // Nothing the replica issued outlives its part of the run (after a failure, the abort above
    // ends it quickly), and the group sees it finish only after its last collective.
    self->rt_->async.drain(r);
    // A collective that failed after the replica stopped looking (one kept past its function and
    // never waited for) fails the run, as a synchronous one would have.
    for (const auto& job : self->rt_->async.take_failed(r)) {
      if (!job->waited) self->record_failure(r, job->error);
    }
    ts.replica = saved;
    self->rt_->group.finish(r);
  };
  if (rt_->pool) {
    rt_->pool->execute(task, &call);
  } else {
    const std::int64_t begin = detail::timeline::enabled() ? detail::timeline::now_ticks() : -1;
    task(&call, 0);
    detail::timeline::commit_deferred(begin);
  }
  if (rt_->first_failure) {
    if (rt_->workers) rt_->workers->local_failure(rt_->first_failure);
    std::rethrow_exception(std::exchange(rt_->first_failure, nullptr));
  }
}

std::vector<detail::UntypedTensor> Strategy::reduce_flat(ReduceOp op,
                                                         std::vector<std::vector<detail::UntypedTensor>>& leaves,
                                                         const std::vector<std::string>& structures,
                                                         std::optional<int> axis) {
  detail::timeline::Scope trace("reduce", "cross_replica");
  if (trace.active() && !leaves.empty()) {
    std::int64_t bytes = 0;  // of one replica's value
    for (const auto& t : leaves[0]) bytes += static_cast<std::int64_t>(t.bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("tensors", static_cast<std::int64_t>(leaves[0].size()));
    trace.arg("bytes", bytes);
  }
  try {
    return reduce_leaves(op, leaves, structures, axis);
  } catch (...) {
    if (rt_->workers) rt_->workers->local_failure(std::current_exception());
    throw;
  }
}

std::vector<detail::UntypedTensor> Strategy::reduce_leaves(ReduceOp op,
                                                           std::vector<std::vector<detail::UntypedTensor>>& leaves,
                                                           const std::vector<std::string>& structures,
                                                           std::optional<int> axis) {
  const std::size_t n = leaves.size();
  for (std::size_t r = 1; r < n; ++r) {
    if (structures[r] != structures[0]) {
      throw InvalidArgumentError(
          detail::structure_mismatch("reduce", 0, structures[0], static_cast<int>(r), structures[r]));
    }
  }
  // Several workers: each reduces its replicas' values, then the workers sum their results (a
  // non-distributed value is every worker's own and is not summed across them).
  detail::WorkerStage* workers = n == devices_.size() ? rt_->workers.get() : nullptr;
  std::string signature;
  std::vector<detail::UntypedTensor> out;
  std::vector<int64_t> counts;  // per leaf, with workers: the elements (or replicas) a MEAN divides by
  out.reserve(leaves[0].size());
  for (std::size_t i = 0; i < leaves[0].size(); ++i) {
    std::vector<detail::UntypedTensor> parts;
    parts.reserve(n);
    int64_t count = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const detail::UntypedTensor& t = leaves[r][i];
      if (!axis) {
        parts.push_back(t);
        continue;
      }
      const int64_t rank = static_cast<int64_t>(t.shape.size());
      const int a = normalize_axis(*axis, rank, r);
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < a; ++d) outer *= t.shape[d];
      for (int64_t d = a + 1; d < rank; ++d) inner *= t.shape[d];
      Shape reduced = t.shape;
      reduced.erase(reduced.begin() + a);
      detail::UntypedTensor local = detail::make_untyped(t.dtype, reduced, t.device());
      if (local.numel)
        detail::backend_for(t.device()).sum_axis(t.dtype, t.data(), outer, t.shape[a], inner, local.data());
      count += t.shape[a];
      parts.push_back(std::move(local));
    }
    for (std::size_t r = 1; r < n; ++r) {
      if (parts[r].shape != parts[0].shape) {
        throw InvalidArgumentError(str_cat("reduce: shapes differ across replicas: replica 0 has ",
                                           detail::format_shape(leaves[0][i].shape), " and replica ", r, " has ",
                                           detail::format_shape(leaves[r][i].shape),
                                           axis ? " (they may differ only along `axis`)" : "",
                                           leaves[0].size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : ""));
      }
    }
    detail::UntypedTensor result = detail::make_untyped(parts[0].dtype, parts[0].shape, cpu0);
    if (workers) {
      signature += str_cat(i ? ", " : "", dtype_name(result.dtype), detail::format_shape(result.shape));
      cross_device_ops_->reduce(ReduceOp::SUM, parts, result);
      counts.push_back(axis ? count : static_cast<int64_t>(n));
    } else if (!axis) {
      cross_device_ops_->reduce(op, parts, result);
    } else {
      cross_device_ops_->reduce(ReduceOp::SUM, parts, result);
      if (op == ReduceOp::MEAN && result.numel)
        detail::backend_for(cpu0).divide(result.dtype, result.data(), result.numel, count);
    }
    out.push_back(std::move(result));
  }
  if (workers) {
    // Every worker checks the others reduce the same structure before any worker's bytes move.
    const double t = extended_.collective_timeout_seconds();
    workers->agree("reduce",
                   str_cat(op == ReduceOp::SUM ? "SUM" : "MEAN", axis ? str_cat(" axis ", *axis) : "", " of ",
                           structures[0], ": ", signature),
                   t);
    workers->sum(out, counts, t);
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (op == ReduceOp::MEAN && out[i].numel)
        detail::backend_for(cpu0).divide(out[i].dtype, out[i].data(), out[i].numel, counts[i]);
    }
  }
  return out;
}

detail::UntypedTensor Strategy::gather_flat(const std::vector<detail::UntypedTensor>& parts, int axis) const {
  detail::timeline::Scope trace("gather", "cross_replica");
  if (trace.active()) {
    std::int64_t bytes = 0;  // of every replica's part
    for (const auto& p : parts) bytes += static_cast<std::int64_t>(p.bytes());
    trace.arg("bytes", bytes);
    trace.arg("axis", axis);
  }
  if (detail::WorkerStage* workers = rt_->workers.get()) {
    try {
      return workers->gather(parts, axis, extended_.collective_timeout_seconds());
    } catch (...) {
      workers->local_failure(std::current_exception());
      throw;
    }
  }
  std::vector<const Shape*> shapes;
  for (const auto& p : parts) shapes.push_back(&p.shape);
  int a = axis;
  const Shape out_shape = detail::concat_shape("gather", shapes, a);
  detail::UntypedTensor out = detail::make_untyped(parts[0].dtype, out_shape, cpu0);
  std::vector<const detail::UntypedTensor*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  detail::concat_into(ptrs, a, out);
  return out;
}

}  // namespace mirrored
