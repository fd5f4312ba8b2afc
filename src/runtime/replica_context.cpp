#include "mirrored/replica_context.hpp"

#include "collectives/collective_helpers.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/strategy_runtime.hpp"
#include "runtime/worker_stage.hpp"
#include "util/exceptions.hpp"

namespace mirrored {
namespace {

using detail::str_cat;

// Inside merge_fn the replica is in cross-replica context of its strategy.
class MergeScope {
 public:
  explicit MergeScope(Strategy& s) : ts_(detail::thread_state()), saved_replica_(ts_.replica), saved_merge_(ts_.merge) {
    ts_.replica = nullptr;
    ts_.merge = &s;
  }
  ~MergeScope() {
    ts_.replica = saved_replica_;
    ts_.merge = saved_merge_;
  }
  MergeScope(const MergeScope&) = delete;
  MergeScope& operator=(const MergeScope&) = delete;

 private:
  detail::ThreadState& ts_;
  ReplicaContext* saved_replica_;
  Strategy* saved_merge_;
};

// Every replica runs the same check on the same posted data, so all of them throw together.
void validate_all_reduce(int n, const detail::CollectiveGroup& group) {
  using Buffers = CollectiveStep::Buffers;
  const auto* first = static_cast<const Buffers*>(group.payload(0));
  for (int r = 1; r < n; ++r) {
    const auto* other = static_cast<const Buffers*>(group.payload(r));
    MIRRORED_ENFORCE(*other->structure == *first->structure && other->inputs->size() == first->inputs->size(),
                     InvalidArgumentError, "all_reduce: replica ", r,
                     " passed a value with a different structure than replica 0 (", other->inputs->size(), " vs ",
                     first->inputs->size(), " tensors)");
    for (std::size_t i = 0; i < first->inputs->size(); ++i) {
      const auto& a = (*first->inputs)[i];
      const auto& b = (*other->inputs)[i];
      MIRRORED_ENFORCE(a.dtype == b.dtype, InvalidArgumentError, "all_reduce: replica 0 passed dtype ",
                       dtype_name(a.dtype), " but replica ", r, " passed dtype ", dtype_name(b.dtype));
      MIRRORED_ENFORCE(a.shape == b.shape, InvalidArgumentError, "all_reduce: replica 0 passed shape ",
                       detail::format_shape(a.shape), " but replica ", r, " passed shape ",
                       detail::format_shape(b.shape),
                       first->inputs->size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : "");
    }
  }
}

// Runs the part of a collective after a successful join. Other replicas may be reading this
// replica's posted buffers until they leave too, so an error here aborts the group and waits
// for them before it propagates (and the buffers go away).
template <class Body>
void inside_collective(detail::CollectiveGroup& group, int replica, Body body) {
  try {
    body();
  } catch (...) {
    group.leave_failed(replica, detail::describe_exception(std::current_exception()));
    throw;
  }
  group.leave(replica);
}

}  // namespace

void ReplicaContext::check_active(const char* op) const {
  if (detail::is_default_context(this)) return;
  MIRRORED_ENFORCE(detail::thread_state().replica == this, FailedPreconditionError, "ReplicaContext::", op,
                   ": this context of replica ", replica_id_,
                   " is used outside the Strategy::run it belongs to (after that run returned, on another thread, or "
                   "inside merge_fn); call get_replica_context() inside the replica function");
}

double ReplicaContext::timeout(const CommunicationOptions& options) const {
  const double t = options.timeout_seconds.value_or(strategy_->extended().collective_timeout_seconds());
  MIRRORED_ENFORCE(t > 0, InvalidArgumentError, "CommunicationOptions::timeout_seconds must be positive, got ", t);
  return t;
}

void ReplicaContext::all_reduce_flat(ReduceOp op, const std::vector<detail::UntypedTensor>& in,
                                     const std::vector<detail::UntypedTensor>& out, const std::string& structure,
                                     const CommunicationOptions& options) {
  const double t = timeout(options);
  MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError,
                   "CommunicationOptions::bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
  const CollectiveStep::Buffers mine{&in, &out, &structure};
  CrossDeviceOps& ops = *strategy_->cross_device_ops_;
  detail::WorkerStage* workers = strategy_->rt_->workers.get();
  const int n = strategy_->rt_->group.size();  // this process's replicas
  if (n == 1) {
    CollectiveStep solo(mine, t);
    solo.set_bytes_per_pack(options.bytes_per_pack);
    if (workers)
      workers->all_reduce(op, ops, solo, nullptr);
    else
      ops.all_reduce(op, solo);
    return;
  }
  auto& group = strategy_->rt_->group;
  group.join(replica_id_, detail::CollectiveKind::all_reduce, &mine, t);
  inside_collective(group, replica_id_, [&] {
    validate_all_reduce(n, group);
    CollectiveStep step(group, replica_id_, t);
    step.set_bytes_per_pack(options.bytes_per_pack);
    if (workers)
      workers->all_reduce(op, ops, step, &group);
    else
      ops.all_reduce(op, step);
    step.sync();  // nobody's buffers go away while another replica still reads them
  });
}

std::vector<detail::UntypedTensor> ReplicaContext::all_gather_flat(const detail::UntypedTensor& in, int axis,
                                                                   const CommunicationOptions& options) {
  const double t = timeout(options);
  const std::vector<detail::UntypedTensor> ins{in};
  std::vector<detail::UntypedTensor> outs;
  outs.reserve(1);
  const CollectiveStep::Buffers mine{&ins, &outs, nullptr};
  CrossDeviceOps& ops = *strategy_->cross_device_ops_;
  detail::WorkerStage* workers = strategy_->rt_->workers.get();
  const int n = strategy_->rt_->group.size();  // this process's replicas
  if (n == 1 && workers) {
    CollectiveStep solo(mine, t);
    workers->all_gather(axis, ops, solo, nullptr, outs);
    return outs;
  }
  if (n == 1) {
    int a = axis;
    outs.push_back(detail::make_untyped(in.dtype, detail::concat_shape("all_gather", {&in.shape}, a), in.device()));
    CollectiveStep solo(mine, t);
    ops.all_gather(a, solo);
    return outs;
  }
  auto& group = strategy_->rt_->group;
  group.join(replica_id_, detail::CollectiveKind::all_gather, &mine, t);
  inside_collective(group, replica_id_, [&] {
    if (workers) {
      CollectiveStep step(group, replica_id_, t);
      workers->all_gather(axis, ops, step, &group, outs);
      step.sync();
      return;
    }
    std::vector<const Shape*> shapes;
    for (int r = 0; r < n; ++r)
      shapes.push_back(&(*static_cast<const CollectiveStep::Buffers*>(group.payload(r))->inputs)[0].shape);
    int a = axis;
    outs.push_back(detail::make_untyped(in.dtype, detail::concat_shape("all_gather", shapes, a), in.device()));
    CollectiveStep step(group, replica_id_, t);
    step.sync();  // every replica's output exists before a backend may look at it
    ops.all_gather(a, step);
    step.sync();
  });
  return outs;
}

void ReplicaContext::merge_flat(const void* payload, MergeFn run_merge, void* merge_ctx, TakeFn take, void* take_ctx) {
  const int n = strategy_->rt_->group.size();  // this process's replicas (merge_fn runs per worker)
  if (n == 1) {
    {
      MergeScope cross(*strategy_);
      run_merge(merge_ctx, {payload});
    }
    take(take_ctx, payload);
    return;
  }
  auto& group = strategy_->rt_->group;
  const double t = strategy_->extended().collective_timeout_seconds();
  group.join(replica_id_, detail::CollectiveKind::merge_call, payload, t);
  inside_collective(group, replica_id_, [&] {
    if (replica_id_ == 0) {
      std::vector<const void*> payloads(n);
      for (int r = 0; r < n; ++r) payloads[r] = group.payload(r);
      MergeScope cross(*strategy_);
      run_merge(merge_ctx, payloads);
    }
    group.sync(replica_id_, t);
    take(take_ctx, group.payload(0));
    group.sync(replica_id_, t);  // replica 0's result lives until every replica has its copy
  });
}

}  // namespace mirrored
