#include "collectives/collective_plan.hpp"

#include <cxxabi.h>

#include <cstdlib>

#include "collectives/collective_helpers.hpp"
#include "collectives/flight_recorder.hpp"
#include "collectives/nest_structure.hpp"
#include "collectives/packing.hpp"
#include "device/placement.hpp"
#include "mirrored/detail/format.hpp"
#include "util/exceptions.hpp"
#include "util/timeline.hpp"

namespace mirrored::detail {
namespace {

const CollectiveRequest& posted(const CollectiveGroup& group, int r) {
  return *static_cast<const CollectiveRequest*>(group.payload(r));
}

// ----- agree: the checks below run on every replica once all have joined, before any byte
// moves. Each replica checks every replica's post against replica 0's, in the same order, so all
// of them reach the same verdict and throw together: nobody is left waiting for a replica that
// gave up.

// all_reduce and reduce_scatter (`what`): the same op, nest, dtypes, shapes, compression, and the
// pack size of an all-reduce or the pieces of a reduce-scatter.
void agree_reduction(const CollectiveGroup& group, const char* what) {
  const auto& first = posted(group, 0);
  for (int r = 1; r < group.size(); ++r) {
    const auto& other = posted(group, r);
    MIRRORED_ENFORCE(other.op == first.op, InvalidArgumentError, what, ": replica 0 passed reduce op ",
                     reduce_op_name(first.op), " but replica ", r, " passed ", reduce_op_name(other.op));
    if (first.structure && *other.structure != *first.structure)
      throw InvalidArgumentError(structure_mismatch(what, 0, *first.structure, r, *other.structure));
    for (std::size_t i = 0; i < first.inputs->size(); ++i) {
      const auto& a = (*first.inputs)[i];
      const auto& b = (*other.inputs)[i];
      const std::string which = first.inputs->size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : "";
      MIRRORED_ENFORCE(a.dtype == b.dtype, InvalidArgumentError, what, ": replica 0 passed dtype ", dtype_name(a.dtype),
                       " but replica ", r, " passed dtype ", dtype_name(b.dtype), which);
      MIRRORED_ENFORCE(a.shape == b.shape, InvalidArgumentError, what, ": replica 0 passed shape ",
                       format_shape(a.shape), " but replica ", r, " passed shape ", format_shape(b.shape), which);
    }
    // Backends split an all-reduce's work by pack, so replicas planning different packs would
    // leave parts unreduced or write the same bytes. A reduce-scatter reduces one tensor, which is
    // one pack whatever the size.
    const bool packed = first.kind == CollectiveKind::all_reduce || first.kind == CollectiveKind::all_reduce_async;
    MIRRORED_ENFORCE(!packed || other.options.bytes_per_pack == first.options.bytes_per_pack, InvalidArgumentError,
                     what, ": replica 0 passed CommunicationOptions::bytes_per_pack ", first.options.bytes_per_pack,
                     " but replica ", r, " passed ", other.options.bytes_per_pack);
    // The leader sends what every local replica summed: they must agree on how it crosses.
    MIRRORED_ENFORCE(other.options.compression == first.options.compression, InvalidArgumentError, what,
                     ": replica 0 passed CommunicationOptions::compression ",
                     compression_name(first.options.compression), " but replica ", r, " passed ",
                     compression_name(other.options.compression));
    if (first.split) {
      MIRRORED_ENFORCE(*other.split == *first.split, InvalidArgumentError, what,
                       ": replicas cut the result into different pieces: replica 0 ", format_shape(*first.split),
                       ", replica ", r, " ", format_shape(*other.split));
    }
  }
}

// Dtypes and axes; the stage compares shapes (across workers too, after their exchange, so that
// every worker raises the same error).
void agree_all_gather(const CollectiveGroup& group) {
  const UntypedTensor& a = (*posted(group, 0).inputs)[0];
  const int a_axis = posted(group, 0).axis;
  const auto rank = static_cast<int64_t>(a.shape.size());
  for (int r = 1; r < group.size(); ++r) {
    const UntypedTensor& b = (*posted(group, r).inputs)[0];
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

// Where a reduction of one worker's values happens: on the first replica's GPU when every value
// lives on GPUs of one chip (logical GPUs read each other's memory, so nothing has to cross to
// the host), else in host memory. Across workers the stage sums host buffers.
Device reduction_home(const std::vector<std::vector<UntypedTensor>>& values, const WorkerStage& stage) {
  if (stage.num_workers() > 1) return cpu0;
  const Device first = values[0][0].device();
  if (first.is_host()) return cpu0;
  for (const auto& v : values)
    for (const auto& t : v)
      if (!same_memory(t.device(), first)) return cpu0;
  return first;
}

std::string signature_of(const std::vector<std::vector<UntypedTensor>>& values) {
  std::string signature;
  for (std::size_t i = 0; i < values.size(); ++i)
    signature += str_cat(i ? ", " : "", dtype_name(values[i][0].dtype), format_shape(values[i][0].shape));
  return signature;
}

// What a replica posts in merge_call: its arguments and result slot (`payload`) and their type.
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

LocalStage& local_only() {
  static LocalStage stage;
  return stage;
}

}  // namespace

void join_traced(CollectiveGroup& group, int replica, CollectiveKind kind, const void* payload,
                 const Deadline& deadline) {
  timeline::Scope trace("rendezvous", "collective");
  group.join(replica, kind, payload, deadline);
}

CollectivePlan::CollectivePlan(CollectiveGroup& group, std::shared_ptr<CrossDeviceOps> local)
    : group_(group), local_(std::move(local)), stage_(std::make_shared<LocalStage>()) {}

void CollectivePlan::set_stage(std::shared_ptr<WorkerStage> stage) { stage_ = std::move(stage); }

template <class F>
auto CollectivePlan::failing_job_on_error(F body) -> decltype(body()) {
  try {
    return body();
  } catch (...) {
    stage_->local_failure(std::current_exception());
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Replica context.

// A reduction of every replica's post (`what`: all_reduce or reduce_scatter): alone, the stage at
// once; else the join, the agreement, the stage (`run(step, group)`) and a last sync, after which
// nobody's buffers are read any more.
template <class Run>
void CollectivePlan::reduction(const char* what, int replica, const CollectiveRequest& mine, const Deadline& deadline,
                               uint64_t flight_seq, Run run) {
  const CollectiveKind kind = mine.kind;
  const bool async = kind == CollectiveKind::all_reduce_async || kind == CollectiveKind::reduce_scatter_async;
  FlightCall flight(group_.recorder().ring(replica), deadline, kind, mine.inputs, static_cast<int>(mine.op), async,
                    flight_seq);
  if (group_.size() == 1) {
    CollectiveStep solo(mine, deadline);
    run(solo, nullptr);
    flight.done();
    return;
  }
  join_traced(group_, replica, kind, &mine, deadline);
  inside_collective(group_, replica, [&] {
    agree_reduction(group_, what);
    CollectiveStep step(group_, replica, group_.deadline());
    run(step, &group_);
    step.sync();
  });
  flight.done();
}

void CollectivePlan::all_reduce(int replica, const CollectiveRequest& request, const Deadline& deadline,
                                uint64_t flight_seq) {
  reduction("all_reduce", replica, request, deadline, flight_seq, [&](CollectiveStep& step, CollectiveGroup* group) {
    stage_->all_reduce(request.op, *local_, step, group);
  });
}

void CollectivePlan::reduce_scatter(int replica, const CollectiveRequest& request, const Deadline& deadline,
                                    uint64_t flight_seq) {
  reduction(
      "reduce_scatter", replica, request, deadline, flight_seq,
      [&](CollectiveStep& step, CollectiveGroup* group) { stage_->reduce_scatter(request.op, *local_, step, group); });
}

std::vector<UntypedTensor> CollectivePlan::all_gather(int replica, const CollectiveRequest& request,
                                                      const Deadline& deadline) {
  std::vector<UntypedTensor> outs;
  outs.reserve(1);  // posted: other replicas read this vector's element once it exists
  CollectiveRequest mine = request;
  mine.outputs = &outs;
  const int axis = mine.axis;
  FlightCall flight(group_.recorder().ring(replica), deadline, CollectiveKind::all_gather, mine.inputs, -1, false);
  if (group_.size() == 1) {
    CollectiveStep solo(mine, deadline);
    stage_->all_gather(axis, *local_, solo, nullptr, outs);
    flight.done();
    return outs;
  }
  join_traced(group_, replica, CollectiveKind::all_gather, &mine, deadline);
  inside_collective(group_, replica, [&] {
    agree_all_gather(group_);
    CollectiveStep step(group_, replica, group_.deadline());
    stage_->all_gather(axis, *local_, step, &group_, outs);
    step.sync();
  });
  flight.done();
  return outs;
}

void CollectivePlan::merge_call(int replica, const void* payload, const std::type_info& signature,
                                const std::function<void(const std::vector<const void*>&)>& on_first,
                                const std::function<void(const void*)>& take, const Deadline& deadline) {
  const int n = group_.size();
  FlightCall flight(group_.recorder().ring(replica), deadline, CollectiveKind::merge_call, -1, -1, nullptr, 0, false);
  if (n == 1) {
    on_first({payload});
    take(payload);
    flight.done();
    return;
  }
  const MergePost mine{payload, &signature};
  join_traced(group_, replica, CollectiveKind::merge_call, &mine, deadline);
  inside_collective(group_, replica, [&] {
    auto post = [&](int r) -> const MergePost& { return *static_cast<const MergePost*>(group_.payload(r)); };
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
    if (replica == 0) {
      std::vector<const void*> payloads(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) payloads[static_cast<std::size_t>(r)] = post(r).payload;
      on_first(payloads);
    }
    group_.sync(replica, group_.deadline());
    take(post(0).payload);
    group_.sync(replica, group_.deadline());  // replica 0's result lives until every replica has its copy
  });
  flight.done();
}

// ---------------------------------------------------------------------------------------------
// Cross-replica context.

std::vector<UntypedTensor> CollectivePlan::reduce(ReduceOp op, const std::vector<std::vector<UntypedTensor>>& leaves,
                                                  const std::vector<std::string>& structures, std::optional<int> axis,
                                                  bool distributed, const Deadline& deadline) {
  WorkerStage& stage = distributed ? *stage_ : local_only();
  return failing_job_on_error([&] {
    const std::size_t n = leaves.size();
    for (std::size_t r = 1; r < n; ++r) {
      if (structures[r] != structures[0])
        throw InvalidArgumentError(structure_mismatch("reduce", 0, structures[0], static_cast<int>(r), structures[r]));
    }
    // Along an axis, each replica first sums its own value over it; a MEAN then divides by the
    // elements summed over every replica of every worker (counted per leaf).
    std::vector<std::vector<UntypedTensor>> values(leaves[0].size());
    std::vector<int64_t> counts;
    for (std::size_t i = 0; i < leaves[0].size(); ++i) {
      int64_t count = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const UntypedTensor& t = leaves[r][i];
        if (!axis) {
          values[i].push_back(t);
          continue;
        }
        const int64_t rank = static_cast<int64_t>(t.shape.size());
        const int a = normalize_axis(*axis, rank, r);
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < a; ++d) outer *= t.shape[d];
        for (int64_t d = a + 1; d < rank; ++d) inner *= t.shape[d];
        Shape reduced = t.shape;
        reduced.erase(reduced.begin() + a);
        UntypedTensor local = make_untyped(t.dtype, reduced, t.device());
        if (local.numel) backend_for(t.device()).sum_axis(t.dtype, t.data(), outer, t.shape[a], inner, local.data());
        count += t.shape[a];
        values[i].push_back(std::move(local));
      }
      if (axis) counts.push_back(count);
      for (std::size_t r = 1; r < n; ++r) {
        if (values[i][r].shape != values[i][0].shape) {
          throw InvalidArgumentError(str_cat("reduce: shapes differ across replicas: replica 0 has ",
                                             format_shape(leaves[0][i].shape), " and replica ", r, " has ",
                                             format_shape(leaves[r][i].shape),
                                             axis ? " (they may differ only along `axis`)" : "",
                                             leaves[0].size() > 1 ? str_cat(" (tensor ", i, " of the nest)") : ""));
        }
      }
    }
    // Every worker checks the others reduce the same structure before any worker's bytes move.
    stage.agree(
        "reduce",
        [&] {
          return str_cat(op == ReduceOp::SUM ? "SUM" : "MEAN", axis ? str_cat(" axis ", *axis) : "", " of ",
                         structures[0], ": ", signature_of(values));
        },
        deadline);
    // Each leaf is its own pack (as TF's reduce), reduced into host memory.
    std::vector<std::vector<std::size_t>> packs;
    for (std::size_t i = 0; i < values.size(); ++i) packs.push_back({i});
    return reduce_packed(stage, op, values, packs, cpu0, counts, deadline);
  });
}

std::vector<std::vector<UntypedTensor>> CollectivePlan::batch_reduce(
    const char* method, ReduceOp op, const std::vector<std::vector<UntypedTensor>>& values,
    const std::vector<std::vector<Device>>& destinations, const std::vector<Device>& devices,
    const CommunicationOptions& options, const Deadline& deadline) {
  return failing_job_on_error([&] {
    const std::size_t n = devices.size();
    MIRRORED_ENFORCE(options.bytes_per_pack >= 0, InvalidArgumentError, method,
                     ": CommunicationOptions::bytes_per_pack must be >= 0, got ", options.bytes_per_pack);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::string which = values.size() > 1 ? str_cat(" (value ", i, ")") : "";
      for (std::size_t r = 1; r < n; ++r) {
        // The same T for every replica by typing; checked anyway, as the packing relies on it.
        MIRRORED_ENFORCE(values[i][r].dtype == values[i][0].dtype, InvalidArgumentError, method,
                         ": replica 0 passed dtype ", dtype_name(values[i][0].dtype), " but replica ", r,
                         " passed dtype ", dtype_name(values[i][r].dtype), which);
        MIRRORED_ENFORCE(values[i][r].shape == values[i][0].shape, InvalidArgumentError, method,
                         ": replica 0 passed shape ", format_shape(values[i][0].shape), " but replica ", r,
                         " passed shape ", format_shape(values[i][r].shape), which);
      }
    }
    // Every worker checks the others reduce the same values before any bytes move.
    stage_->agree(
        "batch_reduce_to",
        [&] {
          return str_cat(op == ReduceOp::SUM ? "SUM" : "MEAN", " of ", values.size(),
                         " values: ", signature_of(values));
        },
        deadline);
    std::vector<std::vector<UntypedTensor>> out(values.size());
    if (values.empty()) return out;
    bool onto_replicas = true;
    for (const auto& d : destinations) onto_replicas = onto_replicas && d == devices;
    // Reduced and copied in one, where the local ops can and nothing is reduced across workers.
    if (onto_replicas && stage_->num_workers() == 1 && local_->batch_all_reduce(op, values, devices, out, deadline))
      return out;
    // Into host memory (or one chip's memory), then a copy per destination device.
    std::vector<UntypedTensor> firsts;  // every replica's tensors have the same shapes and dtypes
    for (const auto& v : values) firsts.push_back(v[0]);
    const auto reduced = reduce_packed(*stage_, op, values, plan_packs(firsts, options.bytes_per_pack),
                                       reduction_home(values, *stage_), {}, deadline);
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (const Device& d : destinations[i]) {
        if (d == reduced[i].device()) {
          out[i].push_back(reduced[i]);
          continue;
        }
        auto& copy = out[i].emplace_back(make_untyped(reduced[i].dtype, reduced[i].shape, d));
        copy_between(copy.data(), d, reduced[i].data(), reduced[i].device(), copy.bytes());
      }
    }
    return out;
  });
}

std::vector<UntypedTensor> CollectivePlan::reduce_packed(WorkerStage& stage, ReduceOp op,
                                                         const std::vector<std::vector<UntypedTensor>>& values,
                                                         const std::vector<std::vector<std::size_t>>& packs,
                                                         const Device& home, std::vector<int64_t> counts,
                                                         const Deadline& deadline) {
  const std::size_t n = values.empty() ? 0 : values[0].size();  // local replicas
  // A MEAN divides where its divisor is known: in the local reduction when this worker's replicas
  // are all there is, else once after the cross-worker sum (by every replica of every worker, or
  // by the elements counted along an axis).
  const bool divide_after = stage.num_workers() > 1 || !counts.empty();
  const ReduceOp local_op = divide_after ? ReduceOp::SUM : op;
  std::vector<UntypedTensor> out(values.size());
  std::vector<UntypedTensor> sums;  // one per pack, summed across workers in one call
  sums.reserve(packs.size());
  for (const auto& pack : packs) {
    if (pack.size() == 1) {
      const std::size_t i = pack[0];
      out[i] = make_untyped(values[i][0].dtype, values[i][0].shape, home);
      reduce_locally(local_op, values[i], out[i]);
      sums.push_back(out[i]);
      continue;
    }
    // Several tensors: concatenate each replica's into one buffer, reduce once (split below).
    const DType dtype = values[pack[0]][0].dtype;
    int64_t total = 0;
    for (std::size_t i : pack) total += values[i][0].numel;
    std::vector<UntypedTensor> packed(n);
    for (std::size_t r = 0; r < n; ++r) {
      packed[r] = make_untyped(dtype, {total}, home);
      std::size_t offset = 0;
      for (std::size_t i : pack) {
        const auto& t = values[i][r];
        copy_between(static_cast<unsigned char*>(packed[r].data()) + offset, home, t.data(), t.device(), t.bytes());
        offset += t.bytes();
      }
    }
    sums.push_back(make_untyped(dtype, {total}, home));
    reduce_locally(local_op, packed, sums.back());
  }
  // Counts are per leaf and leaves along an axis are packed one each, so they line up with sums.
  stage.sum(sums, counts, deadline);
  if (divide_after && op == ReduceOp::MEAN) {
    const int64_t replicas = static_cast<int64_t>(n) * stage.num_workers();
    for (std::size_t p = 0; p < sums.size(); ++p) {
      if (sums[p].numel)
        backend_for(home).divide(sums[p].dtype, sums[p].data(), sums[p].numel, counts.empty() ? replicas : counts[p]);
    }
  }
  for (std::size_t p = 0; p < packs.size(); ++p) {
    if (packs[p].size() == 1) continue;
    std::size_t offset = 0;
    for (std::size_t i : packs[p]) {
      out[i] = make_untyped(sums[p].dtype, values[i][0].shape, home);
      copy_between(out[i].data(), home, static_cast<unsigned char*>(sums[p].data()) + offset, home, out[i].bytes());
      offset += out[i].bytes();
    }
  }
  return out;
}

void CollectivePlan::reduce_locally(ReduceOp op, const std::vector<UntypedTensor>& parts, const UntypedTensor& out) {
  // Below this the hand-out to the replica threads (a few microseconds) costs more than it saves.
  constexpr std::size_t kParallelMinBytes = std::size_t{1} << 20;
  if (out.bytes() >= kParallelMinBytes && parallel_ &&
      parallel_([&](int part, int num_parts) { local_->reduce_part(op, parts, out, part, num_parts); }))
    return;
  local_->reduce(op, parts, out);
}

UntypedTensor CollectivePlan::gather(const std::vector<UntypedTensor>& parts, int axis, const Deadline& deadline) {
  return failing_job_on_error([&] { return stage_->gather(parts, axis, deadline, parallel_); });
}

void CollectivePlan::broadcast(UntypedTensor& value, const Deadline& deadline) {
  failing_job_on_error([&] { stage_->broadcast(value, deadline); });
}

}  // namespace mirrored::detail
