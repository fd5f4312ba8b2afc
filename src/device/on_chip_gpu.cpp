// A logical GPU's same-chip fused all-reduce, forwarded to its platform's backend.
#include "device/on_chip_gpu.hpp"

#include "device/gpu/gpu_backend.hpp"
#include "device/gpu/gpu_runtime.hpp"

namespace mirrored::detail {

OnChipGpu::OnChipGpu(const Device& gpu) : gpu_(&gpu_runtime().backend(gpu)) {}

DeviceBackend& OnChipGpu::backend() const noexcept { return *gpu_; }

int OnChipGpu::max_fused_replicas() const noexcept { return gpu_->max_fused_replicas(); }

void OnChipGpu::all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                                 int64_t mean_divisor) const {
  gpu_->all_reduce_fused(dtype, in, out, n, count, mean_divisor);
}

DeviceEvent& OnChipGpu::ready_event() const { return gpu_->ready_event(); }

DeviceEvent& OnChipGpu::done_event() const { return gpu_->done_event(); }

}  // namespace mirrored::detail
