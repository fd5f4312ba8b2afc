// InProcessAllReduce: the replica threads of host replicas cooperate, each reducing its own slice.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "collectives/in_process/blocks.hpp"
#include "collectives/stream_copy.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored {

void InProcessAllReduce::reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                const detail::UntypedTensor& out) {
  std::vector<const detail::UntypedTensor*> parts;
  for (const auto& t : per_replica) parts.push_back(&t);
  detail::sum_parts_on(parts, out, out.device(), op == ReduceOp::MEAN ? static_cast<int64_t>(per_replica.size()) : 0);
}

void InProcessAllReduce::reduce_part(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                     const detail::UntypedTensor& out, int part, int parts) {
  bool all_host = out.device().is_host();
  for (const auto& t : per_replica) all_host = all_host && t.device().is_host();
  if (!all_host) {
    CrossDeviceOps::reduce_part(op, per_replica, out, part, parts);
    return;
  }
  // Whole cache lines per part, so that parts never write the same line.
  const std::size_t elem = dtype_size(out.dtype);
  const int64_t align = static_cast<int64_t>(64 / elem);
  const int64_t per = ((out.numel + parts - 1) / parts + align - 1) / align * align;
  const int64_t begin = std::min(out.numel, per * part);
  const int64_t end = std::min(out.numel, begin + per);
  if (begin == end) return;
  const int n = static_cast<int>(per_replica.size());
  const int64_t mean = op == ReduceOp::MEAN ? n : 0;
  auto& host = detail::backend_for(cpu0);
  std::vector<const void*> ptrs(per_replica.size());
  auto* dst = static_cast<unsigned char*>(out.data());
  if (out.bytes() < detail::kStreamMinBytes) {
    for (int r = 0; r < n; ++r) ptrs[r] = static_cast<const unsigned char*>(per_replica[r].data()) + begin * elem;
    host.sum_n_mean(out.dtype, ptrs.data(), n, dst + begin * elem, end - begin, mean);
    return;
  }
  // A result too large to stay cached: each block is summed in a cached scratch block and written
  // around the cache, so the output costs one write, not a read for ownership and a write.
  // Larger than the all-reduce's blocks: a block here is written once, not copied to every replica
  // while in cache, and at 4 replicas 64 KiB streams read the inputs faster (12-13.5 ms instead of
  // 14-15 ms for 64 MiB on the 2-vCPU VM).
  constexpr std::size_t kScratch = 65536;
  alignas(64) unsigned char scratch[kScratch];
  const auto block = static_cast<int64_t>(kScratch / elem);
  for (int64_t b = begin; b < end; b += block) {
    const int64_t len = std::min(block, end - b);
    for (int r = 0; r < n; ++r) ptrs[r] = static_cast<const unsigned char*>(per_replica[r].data()) + b * elem;
    host.sum_n_mean(out.dtype, ptrs.data(), n, scratch, len, mean);
    detail::stream_copy(dst + b * elem, scratch, static_cast<std::size_t>(len) * elem);
  }
  detail::stream_fence();  // before the caller reads what the other parts wrote
}

using detail::kStreamMinBytes;
using detail::in_process::kBlockBytes;

void InProcessAllReduce::all_reduce(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  for (int r = 0; r < n; ++r) {
    for (const auto& t : step.inputs(r)) {
      MIRRORED_ENFORCE(t.device().is_host(), InvalidArgumentError, "InProcessAllReduce::all_reduce: replica ", r,
                       " passed a tensor on ", t.device().to_string(), "; this backend reduces host memory only");
    }
  }
  auto& host = detail::backend_for(cpu0);
  alignas(64) unsigned char scratch[kBlockBytes];
  std::vector<const void*> ptrs(n);
  const auto& mine = step.inputs(me);
  // A pack is one run of same-dtype tensors, seen as one virtual buffer: replica r reduces its
  // slice of that buffer, however the tensors split it. Small tensors cost no extra collective
  // and the work stays balanced.
  const auto packs = step.plan_packs();
  if (me == 0 && detail::log_enabled(LogLevel::debug)) {
    std::size_t bytes = 0;
    for (const auto& t : mine) bytes += t.bytes();
    MIRRORED_LOG(debug, "InProcessAllReduce: ", n, " replicas, ", mine.size(), " tensors in ", packs.size(), " packs, ",
                 bytes, " bytes per replica");
  }
  for (const auto& pack : packs) {
    const DType dtype = mine[pack.front()].dtype;
    const std::size_t elem = dtype_size(dtype);
    int64_t total = 0;
    for (std::size_t i : pack) total += mine[i].numel;
    // This replica's slice, whole cache lines, so replicas never write the same line.
    const int64_t align = static_cast<int64_t>(64 / elem);
    const int64_t per = ((total + n - 1) / n + align - 1) / align * align;
    const int64_t lo = std::min(total, per * me);
    const int64_t hi = std::min(total, lo + per);
    // Blocks small enough that the sum is still in cache when it is copied to the other replicas.
    const int64_t block = static_cast<int64_t>(kBlockBytes / elem);
    // Outputs too large to stay cached are written around the cache from a scratch block: no
    // write-allocate reads of the fresh output lines.
    const bool streaming = static_cast<std::size_t>(total) * elem >= kStreamMinBytes;
    int64_t base = 0;
    for (std::size_t i : pack) {
      const int64_t begin = std::max(lo, base) - base;
      const int64_t end = std::min(hi, base + mine[i].numel) - base;
      base += mine[i].numel;
      for (int64_t b = begin; b < end; b += block) {
        const int64_t len = std::min(block, end - b);
        const std::size_t bytes = static_cast<std::size_t>(len) * elem;
        for (int r = 0; r < n; ++r) ptrs[r] = static_cast<const unsigned char*>(step.inputs(r)[i].data()) + b * elem;
        auto* first = static_cast<unsigned char*>(step.outputs(0)[i].data()) + b * elem;
        unsigned char* sum = streaming ? scratch : first;
        host.sum_n_mean(dtype, ptrs.data(), n, sum, len, op == ReduceOp::MEAN ? n : 0);
        for (int r = streaming ? 0 : 1; r < n; ++r) {
          auto* out = static_cast<unsigned char*>(step.outputs(r)[i].data()) + b * elem;
          if (streaming) {
            detail::stream_copy(out, sum, bytes);
          } else {
            std::memcpy(out, sum, bytes);
          }
        }
      }
    }
    if (streaming) detail::stream_fence();  // before the collective tells the others it is done
  }
}

void InProcessAllReduce::all_gather(int axis, CollectiveStep& step) { detail::gather_into_own_outputs(axis, step); }

}  // namespace mirrored
