#include "cluster/coordinator/multi_worker_runtime.hpp"

#include <cstring>
#include <optional>

#include "cluster/coordinator/shared_gpus.hpp"
#include "collectives/collective_group.hpp"
#include "collectives/collective_helpers.hpp"
#include "collectives/packing.hpp"
#include "device/placement.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"
#include "util/exceptions.hpp"
#include "util/fnv1a.hpp"
#include "util/timeline.hpp"

namespace mirrored::detail::cluster {
namespace {

using TimePoint = Coordinator::Clock::time_point;

// How long a worker that found the workers' calls differ waits for the others' flight-recorder
// states (they found it at the same moment and post theirs at once).
constexpr double kMismatchReportWaitSeconds = 0.5;

// Errors every worker raises together, from the same exchanged data: the job stays usable.
class WorkersInvalidArgument : public InvalidArgumentError {
 public:
  using InvalidArgumentError::InvalidArgumentError;
};
class WorkersFailedPrecondition : public FailedPreconditionError {
 public:
  using FailedPreconditionError::FailedPreconditionError;
};

// A shape check on every worker's shapes: all workers reach the same verdict.
template <class Fn>
auto together(Fn fn) {
  try {
    return fn();
  } catch (const InvalidArgumentError& e) {
    throw WorkersInvalidArgument(e.what());
  }
}

std::string describe_leaves(const std::vector<UntypedTensor>& leaves) {
  std::string out;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    out += str_cat(i ? ", " : "", dtype_name(leaves[i].dtype), format_shape(leaves[i].shape));
  return out.empty() ? "(nothing)" : out;
}

// What an all-reduce or reduce-scatter asks of every worker: op, leaves and compression.
std::string reduction_signature(ReduceOp op, const std::vector<UntypedTensor>& leaves, Compression compression) {
  return str_cat(op == ReduceOp::SUM ? "SUM of " : "MEAN of ", describe_leaves(leaves), ", compression ",
                 compression_name(compression));
}

// The half type float32 and float64 values cross workers in under `compression`; none for the
// other dtypes (integers stay exact; float16 and bfloat16 cross as they are).
std::optional<DType> wire_half(DType dtype, Compression compression) {
  if (compression == Compression::NONE || (dtype != DType::float32 && dtype != DType::float64)) return std::nullopt;
  return compression == Compression::FP16 ? DType::float16 : DType::bfloat16;
}

// What a worker's call looks like in the exchange that starts every cross-worker collective: the
// hash and length of "op: signature".
struct CallHeader {
  uint64_t hash;
  uint64_t size;
  friend bool operator==(const CallHeader&, const CallHeader&) = default;
};

CallHeader header_of(const std::string& text) { return {fnv1a(text), text.size()}; }

// Inside a collective: every worker's header of its call `text`, in rank order.
std::vector<CallHeader> exchange_calls(Coordinator& c, const std::string& text, TimePoint deadline) {
  const CallHeader mine = header_of(text);
  std::vector<CallHeader> all(static_cast<std::size_t>(c.num_workers()));
  c.transport().all_gather(&mine, all.data(), std::vector<std::size_t>(all.size(), sizeof(CallHeader)), deadline);
  return all;
}

// The headers `all` show calls that differ: every worker fetches every call's text, so all of them
// report the same thing — a worker whose op differs from the chief's first (different numbers or
// orders of calls), else the first whose signature differs.
[[noreturn]] void report_different_calls(Coordinator& c, const std::vector<CallHeader>& all, const std::string& text,
                                         TimePoint deadline) {
  std::vector<std::size_t> sizes;
  std::size_t total = 0;
  for (const auto& h : all) {
    sizes.push_back(static_cast<std::size_t>(h.size));
    total += sizes.back();
  }
  std::string texts(total, '\0');
  c.transport().all_gather(text.data(), texts.data(), sizes, deadline);
  std::vector<std::string> each;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    each.push_back(texts.substr(at, s));
    at += s;
  }
  const auto op_of = [](const std::string& t) { return t.substr(0, t.find(':')); };
  const auto message = [&](std::size_t w) {
    return str_cat("MultiWorkerMirroredStrategy: ", c.name(0), " called ", each[0], " but ",
                   c.name(static_cast<int>(w)), " called ", each[w]);
  };
  // Every worker gets here at once: each posts its replicas' state and reads the others'.
  const std::string report = c.flight_report(kMismatchReportWaitSeconds);
  const std::string tail = report.empty() ? report : "; " + report;
  for (std::size_t w = 1; w < each.size(); ++w) {
    if (op_of(each[w]) != op_of(each[0])) {
      throw WorkersFailedPrecondition(message(w) +
                                      " (some workers made a different number of collective calls, or made them in "
                                      "a different order)" +
                                      tail);
    }
  }
  for (std::size_t w = 1; w < each.size(); ++w)
    if (each[w] != each[0]) throw WorkersInvalidArgument(message(w) + tail);
  throw WorkersFailedPrecondition(
      str_cat("MultiWorkerMirroredStrategy: the workers' calls differ, but their descriptions match: ", each[0]));
}

// The cross-worker stage of a collective on the timeline: "cross_worker", its op and this worker's bytes.
void trace_stage(timeline::Scope& trace, const char* op, const std::vector<UntypedTensor>& leaves,
                 Compression compression = Compression::NONE) {
  if (!trace.active()) return;
  std::int64_t bytes = 0;
  for (const auto& t : leaves) bytes += static_cast<std::int64_t>(t.bytes());
  trace.arg("op", op);
  trace.arg("bytes", bytes);
  if (compression != Compression::NONE) trace.arg("compression", compression_name(compression));
}

// Divides every output by the number of replicas of every worker (MEAN after a SUM).
void divide_all(const std::vector<UntypedTensor>& outs, int64_t n) {
  for (const auto& t : outs) {
    if (!t.numel) continue;
    auto& be = backend_for(t.device());
    be.divide(t.dtype, t.data(), t.numel, n);
    be.synchronize();
  }
}

}  // namespace

MultiWorkerRuntime::MultiWorkerRuntime(const ClusterLayout& layout, double timeout_s, const std::vector<Device>& local,
                                       CommunicationImplementation implementation,
                                       const std::vector<std::string>& default_gpus)
    : num_workers_(layout.num_workers), rank_(layout.rank) {
  const bool ring = implementation == CommunicationImplementation::RING;
  coordinator_ = std::make_unique<Coordinator>(layout, timeout_s, static_cast<int>(local.size()),
                                               local.at(0).is_host() ? "CPU" : "GPU", !ring, default_gpus);
  Coordinator& c = *coordinator_;
  // Before NCCL, which would refuse two ranks on one GPU less clearly (or not at all without it).
  check_default_gpus_not_shared(c);
  // The GPU path needs every worker: all of them say whether they can take part.
  const std::string key = c.prefix() + "nccl/possible/";
  c.store().set(key + std::to_string(rank_), !ring && nccl_world_possible(local) ? "1" : "0");
  std::vector<std::string> keys;
  for (int w = 0; w < num_workers_; ++w) keys.push_back(key + std::to_string(w));
  MIRRORED_ENFORCE(c.store().wait(keys, timeout_s).empty(), DeadlineExceededError,
                   "MultiWorkerMirroredStrategy: the workers did not agree on their GPU path within ", timeout_s, " s");
  bool all = true;
  for (const auto& k : keys) all = all && c.store().get(k, 0).value_or("0") == "1";
  MIRRORED_ENFORCE(all || implementation != CommunicationImplementation::NCCL, InvalidArgumentError,
                   "MultiWorkerMirroredStrategy: CommunicationImplementation::NCCL needs every worker's replicas on "
                   "distinct physical GPUs and a build with NCCL");
  if (all) {
    world_ = make_nccl_world_all_reduce(local, rank_, num_workers_, c.store(), c.prefix(), timeout_s);
    c.on_failure([w = world_.get()] { w->abort(); });
  }
}

MultiWorkerRuntime::~MultiWorkerRuntime() { shutdown(); }

void MultiWorkerRuntime::shutdown() {
  coordinator_.reset();
  world_.reset();
}

void MultiWorkerRuntime::local_failure(const std::exception_ptr& error) noexcept {
  if (!coordinator_ || !error) return;
  try {
    std::rethrow_exception(error);
  } catch (const WorkersInvalidArgument&) {
    return;
  } catch (const WorkersFailedPrecondition&) {
    return;
  } catch (...) {
  }
  if (coordinator_->failure()) return;  // the job failed already; this error is a consequence
  coordinator_->fail(
      {static_cast<int>(ErrorCode::ABORTED),
       str_cat(coordinator_->name(rank_),
               " failed outside the workers' collectives, so the job was aborted: ", describe_exception(error))});
}

void MultiWorkerRuntime::rethrow_gpu_failure(const char* what) {
  try {
    throw;
  } catch (const AbortedError&) {
    // Aborted because the job failed elsewhere: report the job's cause.
    if (coordinator_) {
      if (auto f = coordinator_->failure()) {
        FailureNotice n = *f;
        n.message = str_cat("MultiWorkerMirroredStrategy: ", what, ": ", n.message);
        throw_failure(n);
      }
    }
    throw;
  } catch (const Error& e) {
    if (!coordinator_) throw;
    FailureNotice n = coordinator_->fail({static_cast<int>(e.code()), e.what()});
    n.message = str_cat("MultiWorkerMirroredStrategy: ", what, ": ", n.message);
    throw_failure(n);
  }
}

void MultiWorkerRuntime::attach_recorder(FlightRecorder& recorder) {
  if (coordinator_) coordinator_->set_recorder(recorder);
}

Coordinator& MultiWorkerRuntime::coordinator() {
  MIRRORED_ENFORCE(coordinator_, FailedPreconditionError,
                   "MultiWorkerMirroredStrategy: this worker has left the job (the strategy is being destroyed)");
  return *coordinator_;
}

void MultiWorkerRuntime::check_same_call(const std::string& op, const std::string& signature, TimePoint deadline) {
  const std::string text = op + ": " + signature;
  const std::vector<CallHeader> all = exchange_calls(coordinator(), text, deadline);
  for (const auto& h : all)
    if (!(h == all[0])) report_different_calls(coordinator(), all, text, deadline);
}

int MultiWorkerRuntime::count_workers(const char* what, bool mine, const mirrored::Deadline& deadline) {
  timeline::Scope trace("cross_worker", "collective");
  if (trace.active()) trace.arg("op", what);
  int count = 0;
  coordinator().collective(what, deadline, [&](TimePoint d) {
    // The answer rides in the exchange that starts every collective (the same-call check): a
    // worker's call text carries its answer, so one 16-byte all-gather both checks that every
    // worker makes this call and counts the answers.
    const std::string yes = str_cat(what, ": another step"), no = str_cat(what, ": input ended");
    const CallHeader has = header_of(yes), ended = header_of(no);
    const std::vector<CallHeader> all = exchange_calls(coordinator(), mine ? yes : no, d);
    for (const auto& h : all) {
      if (h == has)
        ++count;
      else if (!(h == ended))
        report_different_calls(coordinator(), all, mine ? yes : no, d);
    }
  });
  return count;
}

void MultiWorkerRuntime::agree(const std::string& op, const std::function<std::string()>& signature,
                               const mirrored::Deadline& deadline) {
  coordinator().collective(op.c_str(), deadline, [&](TimePoint d) { check_same_call(op, signature(), d); });
}

namespace {

// The GPU every tensor of `pack` (sources and destinations) lives on, if they share one backend.
std::optional<Device> one_gpu(const std::vector<UntypedTensor>& srcs, const std::vector<UntypedTensor>& dsts,
                              const std::vector<std::size_t>& pack) {
  const Device first = srcs[pack[0]].device();
  if (first.is_host()) return std::nullopt;
  for (std::size_t i : pack)
    if (!same_backend(srcs[i].device(), first) || !same_backend(dsts[i].device(), first)) return std::nullopt;
  return first;
}

// A compressed pack of one GPU's tensors: rounded to `half` by that GPU's cast kernel and widened
// back there, so that only the halves cross the bus (half the bytes each way) and the host
// converts nothing. The bits are the host path's: the same rounding of each element (the backends'
// casts agree), then the transport's sum of halves (all_reduce_half with dtype == half: in float,
// in worker order, rounded once), widened exactly. Complete on return, as the host path is.
void sum_halves_on_gpu(WorkerTransport& transport, DType dtype, DType half, const std::vector<UntypedTensor>& srcs,
                       const std::vector<UntypedTensor>& dsts, const std::vector<std::size_t>& pack, const Device& gpu,
                       TimePoint deadline) {
  DeviceBackend& be = backend_for(gpu);
  int64_t total = 0;
  for (std::size_t i : pack) total += dsts[i].numel;
  const UntypedTensor halves = make_untyped(half, {total}, gpu);
  int64_t at = 0;
  for (std::size_t i : pack) {
    if (srcs[i].numel) be.cast(dtype, srcs[i].data(), half, element_at(halves, at), srcs[i].numel);
    at += srcs[i].numel;
  }
  const UntypedTensor host = make_untyped(half, {total}, cpu0);
  copy_between(host.data(), cpu0, halves.data(), gpu, host.bytes());  // after the casts, on their stream
  transport.all_reduce_half(half, half, host.data(), host.data(), total, deadline);
  copy_between(halves.data(), gpu, host.data(), cpu0, host.bytes());
  at = 0;
  for (std::size_t i : pack) {
    if (dsts[i].numel) be.cast(half, element_at(halves, at), dtype, dsts[i].data(), dsts[i].numel);
    at += dsts[i].numel;
  }
  be.synchronize();
}

}  // namespace

void MultiWorkerRuntime::sum_across(const std::vector<UntypedTensor>& srcs, const std::vector<UntypedTensor>& dsts,
                                    const CommunicationOptions& options, TimePoint deadline) {
  WorkerTransport& transport = coordinator().transport();
  for (const auto& pack : plan_packs(dsts, options.bytes_per_pack)) {
    const DType dtype = dsts[pack[0]].dtype;
    const std::optional<DType> half = wire_half(dtype, options.compression);
    auto reduce = [&](const void* in, void* out, int64_t count) {
      if (half)
        transport.all_reduce_half(dtype, *half, in, out, count, deadline);
      else
        transport.all_reduce_sum(dtype, in, out, count, deadline);
    };
    if (half) {
      if (const std::optional<Device> gpu = one_gpu(srcs, dsts, pack)) {
        sum_halves_on_gpu(transport, dtype, *half, srcs, dsts, pack, *gpu, deadline);
        continue;
      }
    }
    bool direct = pack.size() == 1;
    for (std::size_t i : pack) direct = direct && srcs[i].device().is_host() && dsts[i].device().is_host();
    if (direct) {
      const std::size_t i = pack[0];
      reduce(srcs[i].data(), dsts[i].data(), dsts[i].numel);
      continue;
    }
    // Several tensors (or device memory): one contiguous host buffer per pack.
    int64_t total = 0;
    for (std::size_t i : pack) total += dsts[i].numel;
    UntypedTensor staging = make_untyped(dtype, {total}, cpu0);
    auto* base = static_cast<unsigned char*>(staging.data());
    std::size_t offset = 0;
    for (std::size_t i : pack) {
      copy_between(base + offset, cpu0, srcs[i].data(), srcs[i].device(), srcs[i].bytes());
      offset += srcs[i].bytes();
    }
    reduce(base, base, total);
    offset = 0;
    for (std::size_t i : pack) {
      copy_between(dsts[i].data(), dsts[i].device(), base + offset, cpu0, dsts[i].bytes());
      offset += dsts[i].bytes();
    }
  }
}

void MultiWorkerRuntime::all_reduce(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) {
  const int me = step.replica();
  const int n = step.num_replicas();
  const mirrored::Deadline& deadline = step.deadline();
  if (world_ && world_->covers(step)) {
    // GPU replicas: one NCCL all-reduce over every GPU of every worker, after the same check.
    if (me == 0) {
      timeline::Scope trace("cross_worker", "collective");
      trace_stage(trace, "all_reduce", step.inputs(0));
      // NCCL sums in full precision whatever the compression, but the workers still agree on it.
      const std::string signature = reduction_signature(op, step.inputs(0), step.compression());
      coordinator().collective("all_reduce", deadline,
                               [&](TimePoint d) { check_same_call("all_reduce", signature, d); });
    }
    if (group) group->sync(me, deadline.extended(kLeaderGraceSeconds));
    try {
      world_->all_reduce_sum(step);
    } catch (const Error&) {
      rethrow_gpu_failure("all_reduce across workers (NCCL)");
    }
    if (op == ReduceOp::MEAN) divide_all(step.outputs(me), static_cast<int64_t>(n) * num_workers_);
    return;
  }
  if (n > 1) {
    // Every local replica's outputs hold the local sum once all of them are through.
    local.all_reduce(ReduceOp::SUM, step);
    step.sync();
  }
  if (me == 0) {
    timeline::Scope trace("cross_worker", "collective");
    trace_stage(trace, "all_reduce", step.inputs(0), step.compression());
    const auto& sources = n > 1 ? step.outputs(0) : step.inputs(0);
    const std::string signature = reduction_signature(op, step.inputs(0), step.compression());
    coordinator().collective("all_reduce", deadline, [&](TimePoint d) {
      check_same_call("all_reduce", signature, d);
      sum_across(sources, step.outputs(0), step.options(), d);
    });
    // Before the other local replicas copy the result.
    if (op == ReduceOp::MEAN) divide_all(step.outputs(0), static_cast<int64_t>(n) * num_workers_);
  }
  if (group) {
    group->sync(me, deadline.extended(kLeaderGraceSeconds));
    if (me != 0) {
      const auto& mine = step.outputs(me);
      const auto& first = step.outputs(0);
      for (std::size_t i = 0; i < mine.size(); ++i)
        copy_between(mine[i].data(), mine[i].device(), first[i].data(), first[i].device(), mine[i].bytes());
    }
  }
}

void MultiWorkerRuntime::reduce_scatter(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step,
                                        CollectiveGroup* group) {
  const int me = step.replica();
  const int n = step.num_replicas();
  const mirrored::Deadline& deadline = step.deadline();
  if (me == 0) {
    timeline::Scope trace("cross_worker", "collective");
    trace_stage(trace, "reduce_scatter", step.inputs(0), step.compression());
    const UntypedTensor& first = step.inputs(0)[0];
    std::vector<UntypedTensor> parts;
    for (int r = 0; r < n; ++r) parts.push_back(step.inputs(r)[0]);
    // One local replica on a GPU: its sum stays there (so that a compressed one is rounded there,
    // sum_across); several replicas sum into host memory, which every replica's copy reads.
    const Device home = n == 1 && !first.device().is_host() ? first.device() : cpu0;
    scattered_ = make_untyped(first.dtype, {first.numel}, home);
    local.reduce(ReduceOp::SUM, parts, scattered_);
    std::string signature = reduction_signature(op, step.inputs(0), step.compression()) + ", in pieces";
    for (int64_t piece : step.split()) signature += str_cat(" ", piece);
    coordinator().collective("reduce_scatter", deadline, [&](TimePoint d) {
      check_same_call("reduce_scatter", signature, d);
      sum_across({scattered_}, {scattered_}, step.options(), d);  // one tensor: one pack
    });
    if (op == ReduceOp::MEAN) divide_all({scattered_}, static_cast<int64_t>(n) * num_workers_);
  }
  if (group) group->sync(me, deadline.extended(kLeaderGraceSeconds));
  const UntypedTensor& out = step.outputs(me)[0];
  const int64_t begin = split_begin(step.split(), rank_ * n + me);
  copy_between(out.data(), out.device(), element_at(scattered_, begin), scattered_.device(), out.bytes());
  // The leader keeps its reduction until every local replica has its piece.
  if (group) group->sync(me, deadline.extended(kLeaderGraceSeconds));
  if (me == 0) scattered_ = UntypedTensor();
}

std::vector<Shape> MultiWorkerRuntime::exchange_shapes(const std::vector<const Shape*>& local, std::size_t rank,
                                                       TimePoint deadline) {
  Coordinator& c = coordinator();
  std::vector<int64_t> mine;
  for (const Shape* s : local) mine.insert(mine.end(), s->begin(), s->end());
  const std::size_t bytes = mine.size() * sizeof(int64_t);
  std::vector<int64_t> all(mine.size() * static_cast<std::size_t>(c.num_workers()));
  c.transport().all_gather(mine.data(), all.data(),
                           std::vector<std::size_t>(static_cast<std::size_t>(c.num_workers()), bytes), deadline);
  std::vector<Shape> out;
  const std::size_t count = local.size() * static_cast<std::size_t>(c.num_workers());
  for (std::size_t k = 0; k < count; ++k)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(k * rank),
                     all.begin() + static_cast<std::ptrdiff_t>((k + 1) * rank));
  return out;
}

void MultiWorkerRuntime::gather_across(const UntypedTensor& local_concat, const std::vector<Shape>& shapes,
                                       int local_replicas, int axis, const UntypedTensor& out, TimePoint deadline) {
  Coordinator& c = coordinator();
  const std::size_t elem = dtype_size(out.dtype);
  std::vector<std::size_t> sizes;
  std::vector<Shape> worker_shapes;
  for (int w = 0; w < c.num_workers(); ++w) {
    Shape s = shapes[static_cast<std::size_t>(w * local_replicas)];
    s[static_cast<std::size_t>(axis)] = 0;
    for (int r = 0; r < local_replicas; ++r)
      s[static_cast<std::size_t>(axis)] +=
          shapes[static_cast<std::size_t>(w * local_replicas + r)][static_cast<std::size_t>(axis)];
    sizes.push_back(static_cast<std::size_t>(shape_numel(s)) * elem);
    worker_shapes.push_back(std::move(s));
  }
  UntypedTensor host_local = local_concat;
  if (!local_concat.device().is_host()) {
    host_local = make_untyped(local_concat.dtype, local_concat.shape, cpu0);
    copy_between(host_local.data(), cpu0, local_concat.data(), local_concat.device(), local_concat.bytes());
  }
  if (axis == 0 && out.device().is_host()) {
    // Along the first axis the global result is the workers' results one after the other.
    c.transport().all_gather(host_local.data(), out.data(), sizes, deadline);
    return;
  }
  std::size_t total = 0;
  for (auto s : sizes) total += s;
  UntypedTensor staging = make_untyped(DType::uint8, {static_cast<int64_t>(total)}, cpu0);
  c.transport().all_gather(host_local.data(), staging.data(), sizes, deadline);
  std::vector<UntypedTensor> parts;
  std::size_t at = 0;
  for (int w = 0; w < c.num_workers(); ++w) {
    parts.push_back(make_untyped(out.dtype, worker_shapes[static_cast<std::size_t>(w)], cpu0));
    if (sizes[static_cast<std::size_t>(w)])
      std::memcpy(parts.back().data(), static_cast<unsigned char*>(staging.data()) + at,
                  sizes[static_cast<std::size_t>(w)]);
    at += sizes[static_cast<std::size_t>(w)];
  }
  std::vector<const UntypedTensor*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  concat_into(ptrs, axis, out);
}

UntypedTensor MultiWorkerRuntime::concat_across_workers(const char* op,
                                                        const std::vector<const UntypedTensor*>& local_parts, int axis,
                                                        const Device& home, TimePoint d, const Parallel& parallel) {
  const UntypedTensor& first = *local_parts.at(0);
  check_same_call(op, str_cat("axis ", axis, ", ", dtype_name(first.dtype), " of rank ", first.shape.size()), d);
  std::vector<const Shape*> local_shapes;
  for (const UntypedTensor* p : local_parts) local_shapes.push_back(&p->shape);
  // Every worker checks every replica's shape (the signature made sure the ranks agree across
  // workers, so the exchange has one size), so all of them raise the same error, if any.
  const std::vector<Shape> shapes = exchange_shapes(local_shapes, first.shape.size(), d);
  std::vector<const Shape*> ptrs;
  for (const auto& s : shapes) ptrs.push_back(&s);
  int a = axis;
  const Shape global = together([&] { return concat_shape(op, ptrs, a); });
  int local_axis = axis;
  const Shape local_shape = concat_shape(op, local_shapes, local_axis);
  UntypedTensor local_concat = make_untyped(first.dtype, local_shape, cpu0);
  concat_into(local_parts, a, local_concat, parallel);
  UntypedTensor out = make_untyped(first.dtype, global, home);
  gather_across(local_concat, shapes, static_cast<int>(local_parts.size()), a, out, d);
  return out;
}

void MultiWorkerRuntime::all_gather(int axis, CrossDeviceOps& /*local*/, CollectiveStep& step, CollectiveGroup* group,
                                    std::vector<UntypedTensor>& outs) {
  const int me = step.replica();
  const int n = step.num_replicas();
  const mirrored::Deadline& deadline = step.deadline();
  const UntypedTensor& in = step.inputs(me)[0];
  if (me == 0) {
    timeline::Scope trace("cross_worker", "collective");
    trace_stage(trace, "all_gather", step.inputs(0));
    std::vector<const UntypedTensor*> local_parts;
    for (int r = 0; r < n; ++r) local_parts.push_back(&step.inputs(r)[0]);
    coordinator().collective("all_gather", deadline, [&](TimePoint d) {
      outs.push_back(concat_across_workers("all_gather", local_parts, axis, in.device(), d));
    });
  }
  if (group) {
    group->sync(me, deadline.extended(kLeaderGraceSeconds));
    if (me != 0) {
      const UntypedTensor& first = step.outputs(0)[0];
      outs.push_back(make_untyped(in.dtype, first.shape, in.device()));
      copy_between(outs.back().data(), outs.back().device(), first.data(), first.device(), first.bytes());
    }
  }
}

void MultiWorkerRuntime::sum(std::vector<UntypedTensor>& tensors, std::vector<int64_t>& counts,
                             const mirrored::Deadline& deadline) {
  timeline::Scope trace("cross_worker", "collective");
  trace_stage(trace, "reduce", tensors);
  coordinator().collective("reduce", deadline, [&](TimePoint d) {
    // Cross-replica reductions (Strategy::reduce, batch_reduce_to) are packed by the plan already
    // and take no compression: the default options, one pack per dtype run, full precision.
    sum_across(tensors, tensors, CommunicationOptions{}, d);
    if (!counts.empty())
      coordinator().transport().all_reduce_sum(DType::int64, counts.data(), counts.data(),
                                               static_cast<int64_t>(counts.size()), d);
  });
}

UntypedTensor MultiWorkerRuntime::gather(const std::vector<UntypedTensor>& local_parts, int axis,
                                         const mirrored::Deadline& deadline, const Parallel& parallel) {
  timeline::Scope trace("cross_worker", "collective");
  trace_stage(trace, "gather", local_parts);
  std::vector<const UntypedTensor*> parts;
  for (const auto& p : local_parts) parts.push_back(&p);
  UntypedTensor out;
  coordinator().collective("gather", deadline,
                           [&](TimePoint d) { out = concat_across_workers("gather", parts, axis, cpu0, d, parallel); });
  return out;
}

void MultiWorkerRuntime::broadcast(UntypedTensor& value, const mirrored::Deadline& deadline) {
  timeline::Scope trace("cross_worker", "collective");
  trace_stage(trace, "broadcast", {value});
  const std::string signature = str_cat(dtype_name(value.dtype), format_shape(value.shape));
  coordinator().collective("variable creation (broadcast of the chief's initial value)", deadline, [&](TimePoint d) {
    check_same_call("broadcast", signature, d);
    UntypedTensor host = value;
    if (!value.device().is_host()) {
      host = make_untyped(value.dtype, value.shape, cpu0);
      copy_between(host.data(), cpu0, value.data(), value.device(), value.bytes());
    }
    coordinator().transport().broadcast(host.data(), host.bytes(), d);
    if (!value.device().is_host()) copy_between(value.data(), value.device(), host.data(), cpu0, value.bytes());
  });
}

}  // namespace mirrored::detail::cluster
