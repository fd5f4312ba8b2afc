#include "collective_helpers.hpp"

#include "gpu_hooks.hpp"
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {

void sum_parts_on(const std::vector<const UntypedTensor*>& parts, const UntypedTensor& out, const Device& device,
                  int64_t mean_divisor) {
  if (out.numel == 0) return;
  std::vector<UntypedTensor> staged;
  staged.reserve(parts.size());
  std::vector<const void*> ptrs;
  ptrs.reserve(parts.size());
  for (const UntypedTensor* t : parts) {
    if (same_memory(t->device(), device)) {
      // Work that produced it is ordered on its own device's stream.
      if (!(t->device() == device) && !t->device().is_host()) backend_for(t->device()).synchronize();
      ptrs.push_back(t->data());
    } else {
      staged.push_back(make_untyped(t->dtype, t->shape, device));
      copy_between(staged.back().data(), device, t->data(), t->device(), t->bytes());
      ptrs.push_back(staged.back().data());
    }
  }
  const bool out_here = out.device() == device || (out.device().is_host() && device.is_host());
  const UntypedTensor target = out_here ? out : make_untyped(out.dtype, out.shape, device);
  auto& be = backend_for(device);
  be.sum_n(out.dtype, ptrs.data(), static_cast<int>(ptrs.size()), target.data(), out.numel);
  if (mean_divisor > 0) be.divide(out.dtype, target.data(), out.numel, mean_divisor);
  be.synchronize();
  if (!out_here) copy_between(out.data(), out.device(), target.data(), device, out.bytes());
}

void all_reduce_via_first(ReduceOp op, CollectiveStep& step, const std::vector<std::size_t>& leaves) {
  const int n = step.num_replicas();
  const int me = step.replica();
  if (me == 0) {
    for (std::size_t i : leaves) {
      std::vector<const UntypedTensor*> parts;
      for (int r = 0; r < n; ++r) parts.push_back(&step.inputs(r)[i]);
      const UntypedTensor& out = step.outputs(0)[i];
      sum_parts_on(parts, out, out.device(), op == ReduceOp::MEAN ? n : 0);
    }
  }
  step.sync();
  if (me != 0) {
    for (std::size_t i : leaves) {
      const UntypedTensor& mine = step.outputs(me)[i];
      const UntypedTensor& first = step.outputs(0)[i];
      copy_between(mine.data(), mine.device(), first.data(), first.device(), mine.bytes());
    }
  }
}

}  // namespace mirrored::detail
