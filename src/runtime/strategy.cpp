#include "mirrored/strategy.hpp"

#include <algorithm>
#include <atomic>

#include "collectives/collective_helpers.hpp"
#include "collectives/flight_recorder.hpp"
#include "collectives/nest_structure.hpp"
#include "collectives/ops_selection.hpp"
#include "collectives/worker_stage.hpp"
#include "device/gpu_platform.hpp"
#include "mirrored/replica_context.hpp"
#include "runtime/default_strategy.hpp"
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
  strategy.rt_->plan.broadcast(value, Deadline::after(strategy.extended().collective_timeout_seconds()));
}

int count_workers_with_input(Strategy& strategy, bool mine) {
  strategy.require_cross_replica("DistributedIterator get_next",
                                 "the distributed iterator's steps are taken in cross-replica context, outside run");
  return strategy.rt_->plan.count_workers("DistributedIterator get_next", mine,
                                          Deadline::after(strategy.extended().collective_timeout_seconds()));
}

void input_failed(Strategy& strategy, const std::exception_ptr& error) noexcept {
  strategy.rt_->plan.local_failure(error);
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Strategy.

Strategy::Strategy(std::vector<Device> devices, std::shared_ptr<CrossDeviceOps> cross_device_ops)
    : devices_(std::move(devices)),
      cross_device_ops_(cross_device_ops ? std::move(cross_device_ops) : detail::select_cross_device_ops(devices_)),
      rt_(std::make_unique<detail::StrategyRuntime>(static_cast<int>(devices_.size()), cross_device_ops_,
                                                    detail::env_positive("MIRRORED_COLLECTIVE_TIMEOUT_S", 1800.0),
                                                    detail::stall_warn_seconds())) {
  contexts_.reserve(devices_.size());
  for (int r = 0; r < static_cast<int>(devices_.size()); ++r)
    contexts_.push_back(std::unique_ptr<ReplicaContext>(new ReplicaContext(*this, r)));
  std::vector<std::string> names;
  for (const Device& d : devices_) names.push_back(d.short_name());
  rt_->group.recorder().set_identity(0, 1, std::move(names));
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
  // Large cross-replica reductions split over the replica threads, which are idle outside a run
  // (one core's memory bandwidth is a fraction of the machine's). Inside a run (merge_fn, on a
  // replica thread) or beside another thread's run the lock is taken: the caller's thread does it
  // alone.
  rt_->plan.set_parallel([rt = rt_.get()](const detail::PartFn& fn) {
    std::unique_lock lock(rt->run_mu, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    struct Call {
      const detail::PartFn* fn;
      int parts;
      std::mutex mu;
      std::exception_ptr error;
    } call{&fn, rt->pool->size(), {}, nullptr};
    rt->pool->execute(
        [](void* c, int part) noexcept {
          auto* call = static_cast<Call*>(c);
          try {
            (*call->fn)(part, call->parts);
          } catch (...) {
            std::lock_guard error_lock(call->mu);
            if (!call->error) call->error = std::current_exception();
          }
        },
        &call);
    if (call.error) std::rethrow_exception(call.error);
    return true;
  });
}

void Strategy::attach_workers(std::shared_ptr<detail::WorkerStage> stage) {
  num_workers_ = stage->num_workers();
  worker_index_ = stage->worker_index();
  std::vector<std::string> names;
  for (const Device& d : devices_) names.push_back(d.short_name());
  rt_->group.recorder().set_identity(worker_index_, num_workers_, std::move(names));
  // Peer-loss and cross-worker timeout messages report every worker's replicas.
  stage->attach_recorder(rt_->group.recorder());
  rt_->plan.set_stage(std::move(stage));
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
      if (const Device& d = self->devices_[r]; !d.is_host()) detail::enter_gpu(d);
      call->body(call->ctx, r);
    } catch (...) {
      self->record_failure(r, std::current_exception());
    }
    // Nothing the replica issued outlives its part of the run (after a failure, the abort above
    // ends it quickly), and the group sees it finish only after its last collective.
    self->rt_->async.drain(r);
    // A collective that failed after the replica stopped looking (one kept past its function and
    // never waited for) fails the run, as a synchronous one would have.
    // So does a failure found on the device after wait() returned the value (device_error).
    for (const auto& job : self->rt_->async.take_failed(r)) {
      if (job->device_error)
        self->record_failure(r, job->device_error);
      else if (!job->waited)
        self->record_failure(r, job->error);
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
    rt_->plan.local_failure(rt_->first_failure);
    std::rethrow_exception(std::exchange(rt_->first_failure, nullptr));
  }
}

void Strategy::check_component_count(const char* op, std::size_t count) const {
  MIRRORED_ENFORCE(count == devices_.size(), InvalidArgumentError, op, ": a distributed value with ", count,
                   " components cannot be used with ", name(), " of ", devices_.size(), " replicas");
}

std::vector<detail::UntypedTensor> Strategy::reduce_flat(ReduceOp op,
                                                         std::vector<std::vector<detail::UntypedTensor>>& leaves,
                                                         const std::vector<std::string>& structures,
                                                         std::optional<int> axis, std::optional<DType> as) {
  if (as) {
    for (auto& replica_leaves : leaves)
      for (auto& leaf : replica_leaves) leaf = detail::cast_untyped(leaf, *as);
  }
  detail::timeline::Scope trace("reduce", "cross_replica");
  if (trace.active() && !leaves.empty()) {
    std::int64_t bytes = 0;  // of one replica's value
    for (const auto& t : leaves[0]) bytes += static_cast<std::int64_t>(t.bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("tensors", static_cast<std::int64_t>(leaves[0].size()));
    trace.arg("bytes", bytes);
  }
  // A value that is not per replica (one leaf set) is every worker's own: not summed across them.
  const bool distributed = leaves.size() == devices_.size();
  return rt_->plan.reduce(op, leaves, structures, axis, distributed,
                          Deadline::after(extended_.collective_timeout_seconds()));
}

detail::UntypedTensor Strategy::gather_flat(const std::vector<detail::UntypedTensor>& parts, int axis) const {
  detail::timeline::Scope trace("gather", "cross_replica");
  if (trace.active()) {
    std::int64_t bytes = 0;  // of every replica's part
    for (const auto& p : parts) bytes += static_cast<std::int64_t>(p.bytes());
    trace.arg("bytes", bytes);
    trace.arg("axis", axis);
  }
  return rt_->plan.gather(parts, axis, Deadline::after(extended_.collective_timeout_seconds()));
}

}  // namespace mirrored
