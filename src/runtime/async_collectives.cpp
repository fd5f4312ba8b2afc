#include "runtime/async_collectives.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <utility>

#include "collectives/collective_group.hpp"
#include "collectives/collective_helpers.hpp"
#include "collectives/deferred_completion.hpp"
#include "collectives/flight_recorder.hpp"
#include "device/gpu_platform.hpp"
#include "mirrored/replica_context.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/strategy_runtime.hpp"
#include "runtime/thread_state.hpp"
#include "util/calling_replica.hpp"
#include "util/exceptions.hpp"
#include "util/log.hpp"
#include "util/thread_name.hpp"
#include "util/timeline.hpp"

namespace mirrored {
namespace detail {
namespace {}  // namespace

AsyncCollectives::AsyncCollectives(int num_replicas) {
  lanes_.reserve(static_cast<std::size_t>(num_replicas));
  for (int r = 0; r < num_replicas; ++r) lanes_.push_back(std::make_unique<Lane>());
}

AsyncCollectives::~AsyncCollectives() {
  for (auto& lane : lanes_) {
    {
      std::lock_guard lock(lane->mu);
      lane->stop = true;
    }
    lane->cv.notify_all();
    if (lane->thread.joinable()) lane->thread.join();
  }
}

void AsyncCollectives::submit(std::shared_ptr<AsyncCollective> job) {
  Lane& lane = *lanes_[static_cast<std::size_t>(job->replica)];
  {
    std::lock_guard lock(lane.mu);
    if (!lane.thread.joinable()) {
      const int r = job->replica;
      lane.thread = std::thread([this, &lane, r] {
        // Its own track in a timeline: the transfers that overlap the replica's work.
        timeline::name_this_thread(str_cat("communication ", r));
        loop(lane);
      });
      // Not the replica thread's name, which it would inherit ("mirrored/r<r>").
      set_os_thread_name(lane.thread, str_cat("mirrored/c", r));
    }
    lane.queue.push_back(std::move(job));
    lane.pending.fetch_add(1, std::memory_order_acq_rel);  // after anything that may throw
  }
  lane.cv.notify_one();
}

void AsyncCollectives::drain(int replica) noexcept {
  std::atomic<int64_t>& pending = lanes_[static_cast<std::size_t>(replica)]->pending;
  for (int64_t p = pending.load(std::memory_order_acquire); p != 0; p = pending.load(std::memory_order_acquire))
    pending.wait(p, std::memory_order_acquire);
}

std::vector<std::shared_ptr<AsyncCollective>> AsyncCollectives::take_failed(int replica) {
  Lane& lane = *lanes_[static_cast<std::size_t>(replica)];
  std::lock_guard lock(lane.mu);
  return std::exchange(lane.failed, {});
}

void AsyncCollectives::loop(Lane& lane) {
  for (;;) {
    std::shared_ptr<AsyncCollective> job;
    {
      std::unique_lock lock(lane.mu);
      lane.cv.wait(lock, [&] { return lane.stop || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, and nothing issued is left
      job = std::move(lane.queue.front());
      lane.queue.pop_front();
    }
    AsyncRunner::run(*job);
    if (job->ticket) watchdog_.cancel(*job->ticket);
    if (job->error || job->device_error) {
      std::lock_guard lock(lane.mu);
      lane.failed.push_back(job);
    }
    job.reset();  // the owner may have gone already: its tensors go here
    if (lane.pending.fetch_sub(1, std::memory_order_acq_rel) == 1) lane.pending.notify_all();
  }
}

void AsyncRunner::run(AsyncCollective& job) noexcept {
  std::exception_ptr error;
  // An NCCL collective's completion wait (its errors and deadline) runs after the result is
  // published: wait() then returns once the outputs are ordered on the device, without a host wait.
  std::optional<DeferredCompletion> deferred;
  try {
    ReplicaContext& ctx = *job.ctx;
    // The collective on the lane, from its start to its result (its rendezvous inside): the
    // communication that overlaps the replica's work, or that the replica waits for.
    timeline::Scope trace(job.reduce_scatter ? "reduce_scatter_async" : "all_reduce_async", "collective");
    if (trace.active()) {
      std::int64_t bytes = 0;
      for (const auto& t : job.in) bytes += static_cast<std::int64_t>(t.bytes());
      trace.arg("op", reduce_op_name(job.op));
      trace.arg("bytes", bytes);
      trace.arg("tensors", static_cast<std::int64_t>(job.in.size()));
    }
    // The lane works for this replica: GPU messages name it, and what its kernels find is its.
    const ActingReplicaScope acting(ctx.replica_id_in_sync_group());
    // The deadline made when the collective was issued. The watchdog aborts the group then and
    // reports the expiry; the waits below end a grace later, should they not see that abort.
    const Deadline backstop = job.deadline.extended(kCollectiveGraceSeconds);
    if (job.backend) {
      const Device& device = job.backend->device();
      enter_gpu(device);
      DeviceBackend::StreamScope scope(*job.backend, StreamKind::communication);
      // The communication stream starts after the work that produced the inputs: an ordering on
      // the device, not a host wait (wait() makes none before the value is read). Other replicas'
      // threads that read these inputs order themselves after the compute stream that produced
      // them: an event recorded on it (sum_range_on) or a synchronize of it (copy_between's host
      // staging and same-chip copies), which the calling thread's stream of this backend is.
      job.backend->wait_event(*job.issued);
      // The compute stream allocated these blocks; the communication stream uses them. Marked
      // before the collective, not after: when it fails with work still queued on this stream, the
      // blocks must not go back to the compute stream's pool until that work is done (the marks
      // are turned into events when the blocks are freed).
      for (const auto* leaves : {&job.in, &job.out}) {
        for (const UntypedTensor& t : *leaves) {
          if (t.storage && !t.storage->foreign() && t.device() == device)
            job.backend->record_stream_use(t.data(), *job.backend);
        }
      }
      // With one worker only: across workers the leader sends the local result on to the other
      // workers within the collective, which must not happen before NCCL's errors are checked.
      if (ctx.strategy().extended().num_workers() == 1) deferred.emplace();
      ctx.joined(job.request(job.kind()), backstop, job.flight_seq);
      job.backend->record_event(*job.completed);
    } else {
      ctx.joined(job.request(job.kind()), backstop, job.flight_seq);
    }
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard lock(job.mu);
    // The watchdog gave up on it first: whatever happened since (an AbortedError it caused, or
    // a late success) is reported as the deadline it missed.
    if (job.expired) error = std::make_exception_ptr(DeadlineExceededError(job.expiry));
    job.error = std::move(error);
    job.done.store(true, std::memory_order_release);
  }
  job.done.notify_all();
  if (!deferred) return;
  // After a failure the destructor runs (and logs) them: the failure was reported already.
  if (!job.error) {
    try {
      deferred->run();
    } catch (...) {
      // The value was handed out: the failure fails the replica's run (strategy.cpp), and the
      // communicators are aborted, so the next collective fails too rather than hang.
      job.device_error = std::current_exception();
    }
  }
  deferred.reset();
}

void AsyncRunner::record_failure(AsyncCollective& job) noexcept { job.ctx->record_async_failure(job.error); }

void wait_done(const AsyncCollective& job) noexcept {
  while (!job.done.load(std::memory_order_acquire)) job.done.wait(false, std::memory_order_acquire);
}

const std::vector<UntypedTensor>& wait_async(AsyncCollective& job) {
  MIRRORED_ENFORCE(!job.waited, FailedPreconditionError,
                   "PendingCollective::wait: the result of this collective was already taken");
  job.waited = true;
  {
    // The replica's wait for it (PendingCollective::wait): the communication it did not hide.
    timeline::Scope trace(job.reduce_scatter ? "reduce_scatter_async.wait" : "all_reduce_async.wait", "collective");
    wait_done(job);
  }
  if (job.error) std::rethrow_exception(job.error);
  // The calling thread's stream reads the outputs only after the communication stream wrote them.
  if (job.backend) job.backend->wait_event(*job.completed);
  return job.out;
}

bool async_ready(const AsyncCollective& job) noexcept {
  if (!job.done.load(std::memory_order_acquire)) return false;
  if (job.error || !job.completed) return true;
  try {
    return job.completed->query();
  } catch (...) {
    return true;  // a failed device: wait() reports it
  }
}

void discard_async(AsyncCollective& job) noexcept {
  if (job.waited) return;
  job.waited = true;
  wait_done(job);
  if (!job.error) return;
  // Nobody will see this error through wait(). While the replica unwinds an exception of its own,
  // that one is the failure of the run; otherwise this one is, as if the replica had thrown it.
  if (std::uncaught_exceptions() == 0 && job.ctx && thread_state().replica == job.ctx) {
    AsyncRunner::record_failure(job);
  } else {
    MIRRORED_LOG(debug, "an asynchronous all_reduce of replica ", job.replica,
                 " failed and was never waited for: ", describe_exception(job.error));
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// ReplicaContext's asynchronous calls.

std::shared_ptr<detail::AsyncCollective> ReplicaContext::issue_async(bool reduce_scatter, ReduceOp op,
                                                                     std::vector<detail::UntypedTensor> in,
                                                                     const std::vector<char>& scratch,
                                                                     std::string structure,
                                                                     const CommunicationOptions& options) {
  const Deadline deadline = this->deadline(options);
  const double t = deadline.timeout_seconds();
  detail::StrategyRuntime& rt = *strategy_->rt_;
  auto job = std::make_shared<detail::AsyncCollective>();
  job->ctx = this;
  job->lanes = &rt.async;
  job->group = &rt.group;
  job->replica = replica_id_;
  job->reduce_scatter = reduce_scatter;
  job->op = op;
  job->structure = std::move(structure);
  job->options = options;
  job->deadline = deadline;
  job->out.reserve(in.size());
  if (reduce_scatter) {
    const Shape shape =
        detail::reduce_scatter_piece(in[0], replica_id_in_sync_group(), num_replicas_in_sync(), job->split);
    job->out.push_back(detail::make_untyped(in[0].dtype, shape, in[0].device()));
  } else {
    // In place only where the backend reads every byte before anyone writes it, and nothing reads
    // the inputs after the local reduction (across workers the stage reads the local results).
    const bool may_reuse = rt.plan.reduces_in_place();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const detail::UntypedTensor& x = in[i];
      if (may_reuse && scratch[i] && !x.storage->foreign())
        job->out.push_back(x);
      else
        job->out.push_back(detail::make_untyped(x.dtype, x.shape, x.device()));
    }
  }
  job->in = std::move(in);
  if (rt.plan.alone()) {
    // One replica and no other worker: the "reduction" is a copy on the replica's own stream, with
    // nothing to overlap; it runs here, and wait() reports its outcome.
    try {
      joined(job->request(reduce_scatter ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce), deadline);
    } catch (...) {
      job->error = std::current_exception();
    }
    job->done.store(true, std::memory_order_release);
    return job;
  }
  if (const Device& d = strategy_->devices_[static_cast<std::size_t>(replica_id_)]; !d.is_host()) {
    job->backend = &detail::backend_for(d);
    job->issued = job->backend->create_event();
    job->completed = job->backend->create_event();
    job->backend->record_event(*job->issued);  // after the work that produced the inputs
  }
  {
    // Issued now; the lane enters it when it gets to it.
    const detail::UntypedTensor* first = job->in.empty() ? nullptr : &job->in[0];
    int64_t bytes = 0;
    for (const auto& t : job->in) bytes += static_cast<int64_t>(t.bytes());
    job->flight_seq = rt.group.recorder()
                          .ring(replica_id_)
                          .issue(job->kind(), static_cast<int>(op), first ? static_cast<int>(first->dtype) : -1,
                                 first ? &first->shape : nullptr, bytes, true, false, job->deadline.made());
  }
  const int global = replica_id_in_sync_group();
  job->ticket = rt.async.watchdog().watch(job->deadline.time_point(), [weak = std::weak_ptr(job), global, t] {
    const auto j = weak.lock();
    if (!j) return;
    // Under the job's lock, so that the run cannot end (it waits for this job) before the abort.
    std::lock_guard lock(j->mu);
    if (j->done.load(std::memory_order_acquire)) return;
    j->expired = true;
    j->expiry = detail::str_cat(j->reduce_scatter ? "reduce_scatter_async" : "all_reduce_async", " on replica ", global,
                                ": not complete ", t, " s after it was issued; replicas ", j->group->missing_replicas(),
                                " never arrived (collective timeout ", t,
                                " s; set CommunicationOptions::timeout_seconds or MIRRORED_COLLECTIVE_TIMEOUT_S)");
    j->group->abort(j->expiry);
  });
  try {
    rt.async.submit(job);
  } catch (...) {
    rt.async.watchdog().cancel(*job->ticket);  // never issued: nothing to expire
    throw;
  }
  return job;
}

void ReplicaContext::record_async_failure(std::exception_ptr error) noexcept {
  strategy_->record_failure(replica_id_, std::move(error));
}

void ReplicaContext::drain_async() noexcept {
  if (!detail::is_default_context(this)) strategy_->rt_->async.drain(replica_id_);
}

}  // namespace mirrored
