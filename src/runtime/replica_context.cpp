#include "mirrored/replica_context.hpp"

#include <typeinfo>

#include "collectives/collective_helpers.hpp"
#include "collectives/collective_plan.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/strategy_runtime.hpp"
#include "runtime/thread_state.hpp"
#include "util/exceptions.hpp"
#include "util/timeline.hpp"

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

}  // namespace

void ReplicaContext::check_active(const char* op) const {
  if (detail::is_default_context(this)) return;
  MIRRORED_ENFORCE(detail::thread_state().replica == this, FailedPreconditionError, "ReplicaContext::", op,
                   ": this context of replica ", replica_id_,
                   " is used outside the Strategy::run it belongs to (after that run returned, on another thread, or "
                   "inside merge_fn); call get_replica_context() inside the replica function");
}

Deadline ReplicaContext::deadline(const CommunicationOptions& options) const {
  const double t = options.timeout_seconds.value_or(strategy_->extended().collective_timeout_seconds());
  MIRRORED_ENFORCE(t > 0, InvalidArgumentError, "CommunicationOptions::timeout_seconds must be positive, got ", t);
  MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError,
                   "CommunicationOptions::bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
  return Deadline::after(t);
}

void ReplicaContext::check_mean_of(const char* name, ReduceOp op, bool integer) const {
  if (op == ReduceOp::MEAN && integer) {
    throw InvalidArgumentError(
        str_cat(name, " on replica ", replica_id_,
                ": MEAN of integer values has no exact integer result; reduce floating-point values instead"));
  }
}

std::vector<detail::UntypedTensor> ReplicaContext::all_reduce_flat(ReduceOp op,
                                                                   const std::vector<detail::UntypedTensor>& in,
                                                                   const std::string& structure,
                                                                   const CommunicationOptions& options) {
  std::vector<detail::UntypedTensor> out;
  out.reserve(in.size());
  for (const auto& t : in) out.push_back(detail::make_untyped(t.dtype, t.shape, t.device()));
  detail::timeline::Scope trace("all_reduce", "collective");
  if (trace.active()) {
    std::int64_t bytes = 0;
    for (const auto& leaf : in) bytes += static_cast<std::int64_t>(leaf.bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("dtype", in.empty() ? "none" : dtype_name(in[0].dtype));
    trace.arg("bytes", bytes);
    trace.arg("tensors", static_cast<std::int64_t>(in.size()));
  }
  const Deadline d = deadline(options);
  drain_async();
  joined({.kind = CollectiveKind::all_reduce,
          .op = op,
          .inputs = &in,
          .outputs = &out,
          .structure = &structure,
          .options = options},
         d);
  return out;
}

detail::UntypedTensor ReplicaContext::reduce_scatter_flat(ReduceOp op, const detail::UntypedTensor& in,
                                                          const CommunicationOptions& options) {
  detail::timeline::Scope trace("reduce_scatter", "collective");
  if (trace.active()) {
    trace.arg("op", reduce_op_name(op));
    trace.arg("dtype", dtype_name(in.dtype));
    trace.arg("bytes", static_cast<std::int64_t>(in.bytes()));
  }
  const Deadline d = deadline(options);
  std::vector<int64_t> split;
  const Shape shape = detail::reduce_scatter_piece(in, replica_id_in_sync_group(), num_replicas_in_sync(), split);
  const std::vector<detail::UntypedTensor> ins{in};
  const std::vector<detail::UntypedTensor> outs{detail::make_untyped(in.dtype, shape, in.device())};
  drain_async();
  joined({.kind = CollectiveKind::reduce_scatter,
          .op = op,
          .inputs = &ins,
          .outputs = &outs,
          .options = options,
          .split = &split},
         d);
  return outs[0];
}

void ReplicaContext::optimizer_step(detail::OptimizerStep& step) {
  check_active("apply_gradients");
  const Deadline d = deadline(step.communication);
  drain_async();
  strategy_->rt_->plan.apply_gradients(replica_id_, step, d);
}

void ReplicaContext::joined(const CollectiveRequest& request, const Deadline& deadline, uint64_t flight_seq) {
  auto& plan = strategy_->rt_->plan;
  switch (request.kind) {
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::reduce_scatter_async: plan.reduce_scatter(replica_id_, request, deadline, flight_seq); return;
    default: plan.all_reduce(replica_id_, request, deadline, flight_seq); return;
  }
}

std::vector<detail::UntypedTensor> ReplicaContext::all_gather_flat(const detail::UntypedTensor& in, int axis,
                                                                   const CommunicationOptions& options) {
  detail::timeline::Scope trace("all_gather", "collective");
  if (trace.active()) {
    trace.arg("dtype", dtype_name(in.dtype));
    trace.arg("bytes", static_cast<std::int64_t>(in.bytes()));
    trace.arg("axis", axis);
  }
  const Deadline d = deadline(options);
  drain_async();
  const std::vector<detail::UntypedTensor> ins{in};
  return strategy_->rt_->plan.all_gather(
      replica_id_, {.kind = CollectiveKind::all_gather, .inputs = &ins, .axis = axis, .options = options}, d);
}

void ReplicaContext::agree_on_variables(const char* op, const std::vector<const void*>& ids,
                                        const std::vector<std::string>& names) {
  check_active(op);
  drain_async();
  const Deadline d = Deadline::after(strategy_->extended().collective_timeout_seconds());
  strategy_->rt_->plan.agree_on_variables(replica_id_, op, ids, names, d);
}

void ReplicaContext::merge_flat(const void* payload, const std::type_info& signature, MergeFn run_merge,
                                void* merge_ctx, TakeFn take, void* take_ctx) {
  detail::timeline::Scope trace("merge_call", "collective");
  drain_async();
  const Deadline d = Deadline::after(strategy_->extended().collective_timeout_seconds());
  strategy_->rt_->plan.merge_call(
      replica_id_, payload, signature,
      [&](const std::vector<const void*>& payloads) {
        detail::timeline::Scope trace_fn("merge_fn", "collective");
        MergeScope cross(*strategy_);
        run_merge(merge_ctx, payloads);
      },
      [&](const void* first) { take(take_ctx, first); }, d);
}

namespace detail {

void apply_optimizer_step(ReplicaContext* ctx, OptimizerStep& step) {
  if (!ctx) {
    update_copies(step, step.grads);  // a plain variable: nothing to reduce
    return;
  }
  ctx->optimizer_step(step);
}

void agree_on_variables(ReplicaContext& ctx, const char* op, const std::vector<const void*>& ids,
                        const std::vector<std::string>& names) {
  ctx.agree_on_variables(op, ids, names);
}

}  // namespace detail

}  // namespace mirrored
