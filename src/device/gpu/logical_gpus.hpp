#pragma once
// Private: the logical-GPU table (physical GPUs, some split into several logical GPUs by
// `config::set_logical_gpu_devices`) and the placement questions the core asks about devices.

#include <utility>

#include "mirrored/device.hpp"

namespace mirrored::detail {

/// Number of logical GPUs (the GPU runtime's physical ones, split per `set_logical_gpu_devices`).
int logical_gpu_count();
/// Physical GPU and sub-index behind logical GPU `index`. \throws NotFoundError when it does not exist.
std::pair<int, int> logical_gpu_location(int index);
/// Marks GPUs as in use: the logical table can no longer change.
void mark_gpus_used();

/// True when one backend serves both devices: two host devices (every `CPU:k` is the host), or
/// two names of the same logical GPU. Memory of one is then memory of the other, ordered on the same stream.
bool same_backend(const Device& a, const Device& b);
/// True when kernels of either device can address the other's memory directly: `same_backend`,
/// or two logical GPUs on one physical GPU (whose work is ordered on different streams).
bool same_memory(const Device& a, const Device& b);

}  // namespace mirrored::detail
