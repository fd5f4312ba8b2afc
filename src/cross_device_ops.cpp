#include "mirrored/cross_device_ops.hpp"

#include <algorithm>
#include <cstring>

#include "gpu_hooks.hpp"
#include "gpu_registry.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/ops_selection.hpp"
#include "mirrored/detail/packing.hpp"
#include "mirrored/errors.hpp"
#include "stream_copy.hpp"

namespace mirrored {
namespace detail {
namespace {

// Sums `per_replica` into `out` on `device` in replica order, staging copies there as needed.
void reduce_on_device(ReduceOp op, const std::vector<UntypedTensor>& per_replica, const UntypedTensor& out,
                      const Device& device) {
  const int n = static_cast<int>(per_replica.size());
  std::vector<UntypedTensor> staged;
  std::vector<const void*> ptrs;
  ptrs.reserve(n);
  for (const auto& t : per_replica) {
    if (t.device() == device || (t.device().is_host() && device.is_host())) {
      ptrs.push_back(t.data());
    } else if (same_memory(t.device(), device)) {
      // Another logical GPU of the same chip: its kernels' results are read in place.
      backend_for(t.device()).synchronize();
      ptrs.push_back(t.data());
    } else {
      staged.push_back(make_untyped(t.dtype, t.shape, device));
      copy_between(staged.back().data(), device, t.data(), t.device(), t.bytes());
      ptrs.push_back(staged.back().data());
    }
  }
  const bool out_here = out.device() == device || (out.device().is_host() && device.is_host());
  UntypedTensor target = out_here ? out : make_untyped(out.dtype, out.shape, device);
  auto& be = backend_for(device);
  if (out.numel) {
    be.sum_n(out.dtype, ptrs.data(), n, target.data(), out.numel);
    if (op == ReduceOp::MEAN) be.divide(out.dtype, target.data(), out.numel, n);
  }
  be.synchronize();
  if (!out_here) copy_between(out.data(), out.device(), target.data(), device, out.bytes());
}

void gather_into_own_outputs(int axis, CollectiveStep& step) {
  const int me = step.replica();
  const auto& outs = step.outputs(me);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::vector<const UntypedTensor*> parts;
    for (int r = 0; r < step.num_replicas(); ++r) parts.push_back(&step.inputs(r)[i]);
    concat_into(parts, axis, outs[i]);
  }
}

}  // namespace

void concat_into(const std::vector<const UntypedTensor*>& parts, int axis, const UntypedTensor& out) {
  const std::size_t elem = dtype_size(out.dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= out.shape[d];
  for (std::size_t d = axis + 1; d < out.shape.size(); ++d) inner *= out.shape[d];
  const int64_t out_row = out.shape[axis] * inner;
  auto* dst = static_cast<unsigned char*>(out.data());
  DeviceBackend* strided = nullptr;  // set once a part was copied with copy_rows_within
  int64_t offset = 0;
  for (const UntypedTensor* p : parts) {
    const int64_t row = p->shape[axis] * inner;
    if (row == 0) continue;
    if (outer == 1) {
      copy_between(dst + offset * static_cast<int64_t>(elem), out.device(), p->data(), p->device(), p->bytes());
    } else {
      // One strided copy per part on the output's device (a part from elsewhere is brought there
      // first), instead of one copy per outer index.
      const UntypedTensor* local = p;
      UntypedTensor staged;
      if (!(p->device() == out.device() || (p->device().is_host() && out.device().is_host()))) {
        staged = make_untyped(p->dtype, p->shape, out.device());
        copy_between(staged.data(), out.device(), p->data(), p->device(), p->bytes());
        local = &staged;
      }
      strided = &backend_for(out.device());
      strided->copy_rows_within(dst + offset * static_cast<int64_t>(elem), static_cast<std::size_t>(out_row) * elem,
                                local->data(), static_cast<std::size_t>(row) * elem,
                                static_cast<std::size_t>(row) * elem, static_cast<std::size_t>(outer));
    }
    offset += row;
  }
  if (strided) strided->synchronize();  // complete on return, like copy_between
}

std::shared_ptr<CrossDeviceOps> select_cross_device_ops(const std::vector<Device>& devices) {
  std::vector<ReplicaPlacement> placements;
  placements.reserve(devices.size());
  for (const Device& d : devices) {
    placements.push_back(d.is_host() ? ReplicaPlacement{DeviceType::CPU, -1}
                                     : ReplicaPlacement{DeviceType::GPU, logical_gpu_location(d.index()).first});
  }
  switch (choose_cross_device_ops(placements, nccl_compiled_in())) {
    case CrossDeviceOpsChoice::in_process_all_reduce: return std::make_shared<InProcessAllReduce>();
    case CrossDeviceOpsChoice::nccl_all_reduce: return std::make_shared<NcclAllReduce>();
    case CrossDeviceOpsChoice::reduction_to_one_device: break;
  }
  return std::make_shared<ReductionToOneDevice>();
}

}  // namespace detail

CrossDeviceOps::~CrossDeviceOps() = default;

void CrossDeviceOps::unsupported(const char* op) const {
  throw UnimplementedError(name() + " does not support " + op);
}

void CrossDeviceOps::reduce(ReduceOp, const std::vector<detail::UntypedTensor>&, const detail::UntypedTensor&) {
  unsupported("reduce");
}
void CrossDeviceOps::all_reduce(ReduceOp, detail::CollectiveStep&) { unsupported("all_reduce"); }
void CrossDeviceOps::all_gather(int, detail::CollectiveStep&) { unsupported("all_gather"); }
bool CrossDeviceOps::batch_all_reduce(ReduceOp, const std::vector<std::vector<detail::UntypedTensor>>&,
                                      const std::vector<Device>&, std::vector<std::vector<detail::UntypedTensor>>&,
                                      double) {
  return false;
}

// ---------------------------------------------------------------------------------------------

ReductionToOneDevice::ReductionToOneDevice(std::optional<std::string> reduce_to_device) {
  if (reduce_to_device) reduce_to_device_ = Device::parse(*reduce_to_device);
}

void ReductionToOneDevice::reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                  const detail::UntypedTensor& out) {
  detail::reduce_on_device(op, per_replica, out, reduce_to_device_.value_or(per_replica.at(0).device()));
}

void ReductionToOneDevice::all_reduce(ReduceOp op, detail::CollectiveStep& step) {
  // Logical GPUs sharing one chip: one kernel there reads every input and writes every output.
  if (!reduce_to_device_ && detail::all_reduce_on_chip(op, step)) return;
  const int n = step.num_replicas();
  const int me = step.replica();
  if (me == 0) {
    // Replica 0 forms every sum (on the reduction device) into its own outputs.
    const auto& outs = step.outputs(0);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      std::vector<detail::UntypedTensor> parts;
      parts.reserve(n);
      for (int r = 0; r < n; ++r) parts.push_back(step.inputs(r)[i]);
      detail::reduce_on_device(op, parts, outs[i], reduce_to_device_.value_or(outs[i].device()));
    }
  }
  step.sync();
  if (me != 0) {
    const auto& mine = step.outputs(me);
    const auto& first = step.outputs(0);
    for (std::size_t i = 0; i < mine.size(); ++i)
      detail::copy_between(mine[i].data(), mine[i].device(), first[i].data(), first[i].device(), mine[i].bytes());
  }
}

void ReductionToOneDevice::all_gather(int axis, detail::CollectiveStep& step) { detail::gather_into_own_outputs(axis, step); }

// ---------------------------------------------------------------------------------------------

void InProcessAllReduce::reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                const detail::UntypedTensor& out) {
  detail::reduce_on_device(op, per_replica, out, out.device());
}

namespace {
constexpr std::size_t kBlockBytes = 16384;
// Per replica and pack: at this size the N outputs no longer fit a typical last-level cache
// share, so caching them on the way out only costs bandwidth.
constexpr std::size_t kStreamMinBytes = std::size_t{8} << 20;
}  // namespace

void InProcessAllReduce::all_reduce(ReduceOp op, detail::CollectiveStep& step) {
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
  for (const auto& pack : detail::plan_packs(mine, step.bytes_per_pack())) {
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
        host.sum_n(dtype, ptrs.data(), n, sum, len);
        if (op == ReduceOp::MEAN) host.divide(dtype, sum, len, n);
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

void InProcessAllReduce::all_gather(int axis, detail::CollectiveStep& step) { detail::gather_into_own_outputs(axis, step); }

}  // namespace mirrored
