#pragma once
// Private: the logical-GPU table (physical GPUs, some split into several logical GPUs by
// `config::set_logical_gpu_devices`). The layers above ask where a device lives through
// device/placement.hpp, which answers from this table.

#include <utility>

#include "mirrored/device.hpp"

namespace mirrored::detail {

/// Number of logical GPUs (the GPU runtime's physical ones, split per `set_logical_gpu_devices`).
int logical_gpu_count();
/// Physical GPU and sub-index behind logical GPU `index`. \throws NotFoundError when it does not exist.
std::pair<int, int> logical_gpu_location(int index);
/// Marks GPUs as in use: the logical table can no longer change.
void mark_gpus_used();

}  // namespace mirrored::detail
