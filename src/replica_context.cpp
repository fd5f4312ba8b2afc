#include "mirrored/replica_context.hpp"

#include "default_strategy.hpp"

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
  using Buffers = detail::CollectiveStep::Buffers;
  const auto* first = static_cast<const Buffers*>(group.payload(0));
  for (int r = 1; r < n; ++r) {
    const auto* other = static_cast<const Buffers*>(group.payload(r));
    MIRRORED_ENFORCE(*other->structure == *first->structure && other->inputs->size() == first->inputs->size(),
                     InvalidArgumentError, "all_reduce: replica ", r, " passed a value with a different structure than replica 0 (",
                     other->inputs->size(), " vs ", first->inputs->size(), " tensors)");
    for (std::size_t i = 0; i < first->inputs->size(); ++i) {
      const auto& a = (*first->inputs)[i];
      const auto& b = (*other->inputs)[i];
      MIRRORED_ENFORCE(a.dtype == b.dtype, InvalidArgumentError, "all_reduce: replica 0 passed dtype ", dtype_name(a.dtype),
                       " but replica ", r, " passed dtype ", dtype_name(b.dtype));
      MIRRORED_ENFORCE(a.shape == b.shape, InvalidArgumentError, "all_reduce: replica 0 passed shape ",
                       detail::format_shape(a.shape), " but replica ", r, " passed shape ", detail::format_shape(b.shape),
                       first->inputs->size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : "");
    }
  }
}

std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
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
    group.leave_failed(replica, describe_current_exception());
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
  const double t = options.timeout_seconds.value_or(strategy_->collective_timeout_s_);
  MIRRORED_ENFORCE(t > 0, InvalidArgumentError, "CommunicationOptions::timeout_seconds must be positive, got ", t);
  return t;
}

void ReplicaContext::all_reduce_flat(ReduceOp op, const std::vector<detail::UntypedTensor>& in,
                                     const std::vector<detail::UntypedTensor>& out, const std::string& structure,
                                     const CommunicationOptions& options) {
  const double t = timeout(options);
  MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError,
                   "CommunicationOptions::bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
  const detail::CollectiveStep::Buffers mine{&in, &out, &structure};
  CrossDeviceOps& ops = *strategy_->cross_device_ops_;
  const int n = num_replicas_in_sync();
  if (n == 1) {
    detail::CollectiveStep solo(mine, t);
    solo.set_bytes_per_pack(options.bytes_per_pack);
    ops.all_reduce(op, solo);
    return;
  }
  auto& group = strategy_->group_;
  group.join(replica_id_, detail::CollectiveKind::all_reduce, &mine, t);
  inside_collective(group, replica_id_, [&] {
    validate_all_reduce(n, group);
    detail::CollectiveStep step(group, replica_id_, t);
    step.set_bytes_per_pack(options.bytes_per_pack);
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
  const detail::CollectiveStep::Buffers mine{&ins, &outs, nullptr};
  const int n = num_replicas_in_sync();
  auto& group = strategy_->group_;
  if (n > 1) group.join(replica_id_, detail::CollectiveKind::all_gather, &mine, t);
  auto gather = [&] {
    auto input_of = [&](int r) -> const detail::UntypedTensor& {
      return n == 1 ? in : (*static_cast<const detail::CollectiveStep::Buffers*>(group.payload(r))->inputs)[0];
    };
    const Shape& first = input_of(0).shape;
    for (int r = 0; r < n; ++r) {
      const Shape& s = input_of(r).shape;
      MIRRORED_ENFORCE(!s.empty(), InvalidArgumentError, "all_gather: replica ", r,
                       " passed a rank-0 value; all_gather needs rank >= 1 (reshape it to (1,) first)");
      MIRRORED_ENFORCE(s.size() == first.size(), InvalidArgumentError, "all_gather: ranks differ: replica 0 passed shape ",
                       detail::format_shape(first), " and replica ", r, " passed shape ", detail::format_shape(s));
    }
    const int64_t rank = static_cast<int64_t>(first.size());
    MIRRORED_ENFORCE(axis >= -rank && axis < rank, InvalidArgumentError, "`axis` = ", axis,
                     " out of range for `value` with rank ", rank);
    const int a = axis < 0 ? static_cast<int>(axis + rank) : axis;
    Shape out_shape = first;
    out_shape[a] = 0;
    for (int r = 0; r < n; ++r) {
      const Shape& s = input_of(r).shape;
      for (int64_t d = 0; d < rank; ++d) {
        MIRRORED_ENFORCE(d == a || s[d] == first[d], InvalidArgumentError, "all_gather: shapes may differ only along axis ",
                         a, ": replica 0 passed shape ", detail::format_shape(first), " and replica ", r,
                         " passed shape ", detail::format_shape(s));
      }
      out_shape[a] += s[a];
    }
    outs.push_back(detail::make_untyped(in.dtype, out_shape, in.device()));
    CrossDeviceOps& ops = *strategy_->cross_device_ops_;
    if (n == 1) {
      detail::CollectiveStep solo(mine, t);
      ops.all_gather(a, solo);
      return;
    }
    detail::CollectiveStep step(group, replica_id_, t);
    ops.all_gather(a, step);
    step.sync();
  };
  if (n == 1) gather();
  else inside_collective(group, replica_id_, gather);
  return outs;
}

void ReplicaContext::merge_flat(const void* payload, MergeFn run_merge, void* merge_ctx, TakeFn take,
                                void* take_ctx) {
  const int n = num_replicas_in_sync();
  if (n == 1) {
    {
      MergeScope cross(*strategy_);
      run_merge(merge_ctx, {payload});
    }
    take(take_ctx, payload);
    return;
  }
  auto& group = strategy_->group_;
  const double t = strategy_->collective_timeout_s_;
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
