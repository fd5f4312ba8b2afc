// StrategyExtended's compiled parts: cross-replica reductions onto destinations, packed.
#include "collectives/packing.hpp"
#include "device/gpu/logical_gpus.hpp"
#include "mirrored/strategy.hpp"
#include "runtime/strategy_runtime.hpp"
#include "util/timeline.hpp"

namespace mirrored {

void StrategyExtended::require_cross_replica(const char* method) const { s_.require_cross_replica(method, ""); }

namespace {

void check_batch(const char* method, const std::vector<std::vector<detail::UntypedTensor>>& values, std::size_t n,
                 int64_t bytes_per_pack) {
  MIRRORED_ENFORCE(bytes_per_pack >= 0, InvalidArgumentError, method,
                   ": CommunicationOptions::bytes_per_pack must be >= 0, got ", bytes_per_pack);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::string which = values.size() > 1 ? detail::str_cat(" (value ", i, ")") : "";
    for (std::size_t r = 1; r < n; ++r) {
      // The same T for every replica by typing; checked anyway, as the packing relies on it.
      MIRRORED_ENFORCE(values[i][r].dtype == values[i][0].dtype, InvalidArgumentError, method,
                       ": replica 0 passed dtype ", dtype_name(values[i][0].dtype), " but replica ", r,
                       " passed dtype ", dtype_name(values[i][r].dtype), which);
      MIRRORED_ENFORCE(values[i][r].shape == values[i][0].shape, InvalidArgumentError, method,
                       ": replica 0 passed shape ", detail::format_shape(values[i][0].shape), " but replica ", r,
                       " passed shape ", detail::format_shape(values[i][r].shape), which);
    }
  }
}

// Where batch_reduce_flat reduces: on the first replica's GPU when every value lives on GPUs of
// one chip (logical GPUs read each other's memory, so nothing has to cross to the host), else in
// host memory.
Device reduction_home(const std::vector<std::vector<detail::UntypedTensor>>& values) {
  const Device first = values[0][0].device();
  if (first.is_host()) return cpu0;
  for (const auto& v : values)
    for (const auto& t : v)
      if (!detail::same_memory(t.device(), first)) return cpu0;
  return first;
}

}  // namespace

std::vector<std::vector<detail::UntypedTensor>> StrategyExtended::batch_reduce_onto(
    const char* method, ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& values,
    const std::vector<std::vector<Device>>& destinations, const CommunicationOptions& options) {
  detail::timeline::Scope trace(method, "cross_replica");  // `method` is a literal: "reduce_to", …
  if (trace.active()) {
    std::int64_t bytes = 0;
    for (const auto& v : values) bytes += v.empty() ? 0 : static_cast<std::int64_t>(v[0].bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("tensors", static_cast<std::int64_t>(values.size()));
    trace.arg("bytes", bytes);
  }
  try {
    return batch_reduce_to_devices(method, op, values, destinations, options);
  } catch (...) {
    if (s_.rt_->workers) s_.rt_->workers->local_failure(std::current_exception());
    throw;
  }
}

std::vector<std::vector<detail::UntypedTensor>> StrategyExtended::batch_reduce_to_devices(
    const char* method, ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& values,
    const std::vector<std::vector<Device>>& destinations, const CommunicationOptions& options) {
  const std::size_t n = worker_devices().size();  // this process's replicas
  check_batch(method, values, n, options.bytes_per_pack);
  std::vector<std::vector<detail::UntypedTensor>> out(values.size());
  detail::WorkerStage* workers = s_.rt_->workers.get();
  const double timeout_s = options.timeout_seconds.value_or(collective_timeout_seconds());
  if (workers) {
    // Every worker checks the others reduce the same values before any bytes move.
    std::string signature;
    for (std::size_t i = 0; i < values.size(); ++i) {
      signature +=
          detail::str_cat(i ? ", " : "", dtype_name(values[i][0].dtype), detail::format_shape(values[i][0].shape));
    }
    workers->agree("batch_reduce_to",
                   detail::str_cat(op == ReduceOp::SUM ? "SUM" : "MEAN", " of ", values.size(), " values: ", signature),
                   timeout_s);
  }
  if (values.empty()) return out;
  bool onto_replicas = true;
  for (const auto& d : destinations) onto_replicas = onto_replicas && d == worker_devices();
  if (onto_replicas && !workers) {
    if (s_.cross_device_ops_->batch_all_reduce(op, values, worker_devices(), out, timeout_s)) return out;
  }
  // Into host memory (or one chip's memory), then a copy per destination device.
  const auto reduced = batch_reduce_flat(op, values, options.bytes_per_pack, timeout_s);
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (const Device& d : destinations[i]) {
      if (d == reduced[i].device()) {
        out[i].push_back(reduced[i]);
        continue;
      }
      auto& copy = out[i].emplace_back(detail::make_untyped(reduced[i].dtype, reduced[i].shape, d));
      detail::copy_between(copy.data(), d, reduced[i].data(), reduced[i].device(), copy.bytes());
    }
  }
  return out;
}

std::vector<detail::UntypedTensor> StrategyExtended::batch_reduce_flat(
    ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& values, int64_t bytes_per_pack,
    double timeout_s) {
  const std::size_t n = worker_devices().size();  // this process's replicas
  std::vector<detail::UntypedTensor> out(values.size());
  if (values.empty()) return out;
  // Several workers: each sums its replicas' values (packed as below), the workers sum those
  // sums (packed the same way), and MEAN divides by every worker's replicas.
  detail::WorkerStage* workers = s_.rt_->workers.get();
  const ReduceOp local_op = workers ? ReduceOp::SUM : op;
  const Device home = workers ? cpu0 : reduction_home(values);  // workers sum host buffers
  std::vector<detail::UntypedTensor> pack_results;
  // Plan on replica 0's tensors; every replica's tensors have the same shapes and dtypes.
  std::vector<detail::UntypedTensor> firsts;
  for (const auto& v : values) firsts.push_back(v[0]);
  for (const auto& pack : detail::plan_packs(firsts, bytes_per_pack)) {
    if (pack.size() == 1) {
      const std::size_t i = pack[0];
      out[i] = detail::make_untyped(values[i][0].dtype, values[i][0].shape, home);
      s_.cross_device_ops_->reduce(local_op, values[i], out[i]);
      pack_results.push_back(out[i]);
      continue;
    }
    // Several tensors: concatenate each replica's into one host buffer, reduce once, split.
    const DType dtype = values[pack[0]][0].dtype;
    int64_t total = 0;
    for (std::size_t i : pack) total += values[i][0].numel;
    std::vector<detail::UntypedTensor> packed(n);
    for (std::size_t r = 0; r < n; ++r) {
      packed[r] = detail::make_untyped(dtype, {total}, home);
      std::size_t offset = 0;
      for (std::size_t i : pack) {
        const auto& t = values[i][r];
        detail::copy_between(static_cast<unsigned char*>(packed[r].data()) + offset, home, t.data(), t.device(),
                             t.bytes());
        offset += t.bytes();
      }
    }
    detail::UntypedTensor result = detail::make_untyped(dtype, {total}, home);
    s_.cross_device_ops_->reduce(local_op, packed, result);
    if (workers) {
      std::vector<detail::UntypedTensor> one{result};
      std::vector<int64_t> none;
      workers->sum(one, none, timeout_s);
      if (op == ReduceOp::MEAN && result.numel)
        detail::backend_for(cpu0).divide(dtype, result.data(), result.numel, s_.num_replicas_in_sync());
    }
    std::size_t offset = 0;
    for (std::size_t i : pack) {
      out[i] = detail::make_untyped(dtype, values[i][0].shape, home);
      detail::copy_between(out[i].data(), home, static_cast<unsigned char*>(result.data()) + offset, home,
                           out[i].bytes());
      offset += out[i].bytes();
    }
  }
  if (workers && !pack_results.empty()) {
    // The single-tensor packs, summed across workers in one call.
    std::vector<int64_t> none;
    workers->sum(pack_results, none, timeout_s);
    for (const auto& t : pack_results) {
      if (op == ReduceOp::MEAN && t.numel)
        detail::backend_for(cpu0).divide(t.dtype, t.data(), t.numel, s_.num_replicas_in_sync());
    }
  }
  return out;
}

}  // namespace mirrored
