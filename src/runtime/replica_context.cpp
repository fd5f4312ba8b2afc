#include "mirrored/replica_context.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

#include "collectives/collective_helpers.hpp"
#include "collectives/worker_stage.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/nest_structure.hpp"
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

const CollectiveStep::Buffers& posted(const detail::CollectiveGroup& group, int r) {
  return *static_cast<const CollectiveStep::Buffers*>(group.payload(r));
}

// The checks below run on every replica once all have joined, before any byte moves. Each
// replica checks every replica's post against replica 0's, in the same order, so all of them
// reach the same verdict and throw together: nobody is left waiting for a replica that gave up.

void validate_all_reduce(int n, const detail::CollectiveGroup& group) {
  const auto& first = posted(group, 0);
  for (int r = 1; r < n; ++r) {
    const auto& other = posted(group, r);
    MIRRORED_ENFORCE(other.op == first.op, InvalidArgumentError, "all_reduce: replica 0 passed reduce op ",
                     reduce_op_name(first.op), " but replica ", r, " passed ", reduce_op_name(other.op));
    if (*other.structure != *first.structure)
      throw InvalidArgumentError(detail::structure_mismatch("all_reduce", 0, *first.structure, r, *other.structure));
    for (std::size_t i = 0; i < first.inputs->size(); ++i) {
      const auto& a = (*first.inputs)[i];
      const auto& b = (*other.inputs)[i];
      const std::string which = first.inputs->size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : "";
      MIRRORED_ENFORCE(a.dtype == b.dtype, InvalidArgumentError, "all_reduce: replica 0 passed dtype ",
                       dtype_name(a.dtype), " but replica ", r, " passed dtype ", dtype_name(b.dtype), which);
      MIRRORED_ENFORCE(a.shape == b.shape, InvalidArgumentError, "all_reduce: replica 0 passed shape ",
                       detail::format_shape(a.shape), " but replica ", r, " passed shape ",
                       detail::format_shape(b.shape), which);
    }
    // Backends split the work by pack, so replicas planning different packs would leave parts
    // unreduced or write the same bytes.
    MIRRORED_ENFORCE(other.bytes_per_pack == first.bytes_per_pack, InvalidArgumentError,
                     "all_reduce: replica 0 passed CommunicationOptions::bytes_per_pack ", first.bytes_per_pack,
                     " but replica ", r, " passed ", other.bytes_per_pack);
  }
}

// Returns the shape of the result and sets `axis` to the (non-negative) axis of the gather.
// With `shapes_too` false only dtypes and axes are compared (several workers: shapes are compared
// after the exchange, so that every worker raises the same error).
Shape validate_all_gather(int n, const detail::CollectiveGroup& group, int& axis, bool shapes_too = true) {
  const detail::UntypedTensor& a = (*posted(group, 0).inputs)[0];
  const int a_axis = posted(group, 0).axis;
  const auto rank = static_cast<int64_t>(a.shape.size());
  std::vector<const Shape*> shapes{&a.shape};
  for (int r = 1; r < n; ++r) {
    const detail::UntypedTensor& b = (*posted(group, r).inputs)[0];
    const int b_axis = posted(group, r).axis;
    // Before anything is sized: the result is allocated with each replica's own dtype and every
    // replica's bytes are copied into it.
    MIRRORED_ENFORCE(a.dtype == b.dtype, InvalidArgumentError, "all_gather: replica 0 passed dtype ",
                     dtype_name(a.dtype), " but replica ", r, " passed dtype ", dtype_name(b.dtype));
    // -1 and rank-1 name the same axis; compared once the ranks agree (concat_shape checks them).
    const bool same_rank = !b.shape.empty() && static_cast<int64_t>(b.shape.size()) == rank;
    const int64_t a_norm = a_axis < 0 ? a_axis + rank : a_axis;
    const int64_t b_norm = b_axis < 0 ? b_axis + rank : b_axis;
    MIRRORED_ENFORCE(!same_rank || a_norm == b_norm, InvalidArgumentError, "all_gather: replica 0 passed axis ", a_axis,
                     " but replica ", r, " passed axis ", b_axis, " (for values of rank ", rank, ")");
    shapes.push_back(&b.shape);
  }
  axis = a_axis;
  if (!shapes_too) return {};
  return detail::concat_shape("all_gather", shapes, axis);
}

// What a replica posts in merge_call: its arguments and result slot (`payload`, a
// detail::MergePost) and that MergePost's type.
struct MergePost {
  const void* payload;
  const std::type_info* signature;
};

// "<int, float>" for detail::MergePost<int, float>: the result and argument types of a merge_call.
std::string merge_signature_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status),
                                                   std::free);
  std::string name = status == 0 && demangled ? demangled.get() : type.name();
  constexpr std::string_view kPrefix = "mirrored::detail::MergePost";
  if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
  return name;
}

// The wait of a collective for every replica to join it (the timeline's "rendezvous").
void join_traced(detail::CollectiveGroup& group, int replica, detail::CollectiveKind kind, const void* payload,
                 double timeout_s) {
  detail::timeline::Scope trace("rendezvous", "collective");
  group.join(replica, kind, payload, timeout_s);
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
  detail::timeline::Scope trace("all_reduce", "collective");
  if (trace.active()) {
    std::int64_t bytes = 0;
    for (const auto& leaf : in) bytes += static_cast<std::int64_t>(leaf.bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("dtype", in.empty() ? "none" : dtype_name(in[0].dtype));
    trace.arg("bytes", bytes);
    trace.arg("tensors", static_cast<std::int64_t>(in.size()));
  }
  const double t = timeout(options);
  MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError,
                   "CommunicationOptions::bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
  drain_async();
  all_reduce_joined(detail::CollectiveKind::all_reduce, op, in, out, structure, options.bytes_per_pack, t, t);
}

void ReplicaContext::all_reduce_joined(detail::CollectiveKind kind, ReduceOp op,
                                       const std::vector<detail::UntypedTensor>& in,
                                       const std::vector<detail::UntypedTensor>& out, const std::string& structure,
                                       int64_t bytes_per_pack, double join_timeout_s, double step_timeout_s) {
  const CollectiveStep::Buffers mine{&in, &out, &structure, op, 0, bytes_per_pack};
  CrossDeviceOps& ops = *strategy_->cross_device_ops_;
  detail::WorkerStage* workers = strategy_->rt_->workers.get();
  const int n = strategy_->rt_->group.size();  // this process's replicas
  if (n == 1) {
    CollectiveStep solo(mine, step_timeout_s);
    solo.set_bytes_per_pack(bytes_per_pack);
    if (workers)
      workers->all_reduce(op, ops, solo, nullptr);
    else
      ops.all_reduce(op, solo);
    return;
  }
  auto& group = strategy_->rt_->group;
  join_traced(group, replica_id_, kind, &mine, join_timeout_s);
  inside_collective(group, replica_id_, [&] {
    validate_all_reduce(n, group);
    CollectiveStep step(group, replica_id_, step_timeout_s);
    step.set_bytes_per_pack(bytes_per_pack);
    if (workers)
      workers->all_reduce(op, ops, step, &group);
    else
      ops.all_reduce(op, step);
    step.sync();  // nobody's buffers go away while another replica still reads them
  });
}

std::vector<detail::UntypedTensor> ReplicaContext::all_gather_flat(const detail::UntypedTensor& in, int axis,
                                                                   const CommunicationOptions& options) {
  detail::timeline::Scope trace("all_gather", "collective");
  if (trace.active()) {
    trace.arg("dtype", dtype_name(in.dtype));
    trace.arg("bytes", static_cast<std::int64_t>(in.bytes()));
    trace.arg("axis", axis);
  }
  const double t = timeout(options);
  drain_async();
  const std::vector<detail::UntypedTensor> ins{in};
  std::vector<detail::UntypedTensor> outs;
  outs.reserve(1);
  const CollectiveStep::Buffers mine{&ins, &outs, nullptr, ReduceOp::SUM, axis, 0};
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
  join_traced(group, replica_id_, detail::CollectiveKind::all_gather, &mine, t);
  inside_collective(group, replica_id_, [&] {
    if (workers) {
      int a = axis;
      validate_all_gather(n, group, a, /*shapes_too=*/false);
      CollectiveStep step(group, replica_id_, t);
      workers->all_gather(axis, ops, step, &group, outs);
      step.sync();
      return;
    }
    int a = axis;
    const Shape shape = validate_all_gather(n, group, a);
    outs.push_back(detail::make_untyped(in.dtype, shape, in.device()));
    CollectiveStep step(group, replica_id_, t);
    step.sync();  // every replica's output exists before a backend may look at it
    ops.all_gather(a, step);
    step.sync();
  });
  return outs;
}

void ReplicaContext::merge_flat(const void* payload, const std::type_info& signature, MergeFn run_merge,
                                void* merge_ctx, TakeFn take, void* take_ctx) {
  detail::timeline::Scope trace("merge_call", "collective");
  drain_async();
  const int n = strategy_->rt_->group.size();  // this process's replicas (merge_fn runs per worker)
  if (n == 1) {
    {
      detail::timeline::Scope trace_fn("merge_fn", "collective");
      MergeScope cross(*strategy_);
      run_merge(merge_ctx, {payload});
    }
    take(take_ctx, payload);
    return;
  }
  auto& group = strategy_->rt_->group;
  const double t = strategy_->extended().collective_timeout_seconds();
  const MergePost mine{payload, &signature};
  join_traced(group, replica_id_, detail::CollectiveKind::merge_call, &mine, t);
  inside_collective(group, replica_id_, [&] {
    auto post = [&](int r) -> const MergePost& { return *static_cast<const MergePost*>(group.payload(r)); };
    // Replica 0 reads every replica's arguments, and every replica reads replica 0's result, as
    // the types of its own call: they must be the same types.
    for (int r = 1; r < n; ++r) {
      MIRRORED_ENFORCE(*post(r).signature == *post(0).signature, InvalidArgumentError,
                       "merge_call: replica 0 passed (result, arguments...) of types ",
                       merge_signature_name(*post(0).signature), " but replica ", r, " passed ",
                       merge_signature_name(*post(r).signature),
                       "; every replica must pass arguments of the same types and a merge_fn with the same result "
                       "type");
    }
    if (replica_id_ == 0) {
      std::vector<const void*> payloads(n);
      for (int r = 0; r < n; ++r) payloads[r] = post(r).payload;
      detail::timeline::Scope trace_fn("merge_fn", "collective");
      MergeScope cross(*strategy_);
      run_merge(merge_ctx, payloads);
    }
    group.sync(replica_id_, t);
    take(take_ctx, post(0).payload);
    group.sync(replica_id_, t);  // replica 0's result lives until every replica has its copy
  });
}

}  // namespace mirrored
