#pragma once
// Private: physical GPU discovery and the logical-GPU table.

#include <string>
#include <utility>

namespace mirrored::detail {

/// Number of physical GPUs the CUDA runtime reports; 0 without CUDA or on any runtime error.
int physical_gpu_count() noexcept;
/// Why there are no GPUs, for error messages ("built without CUDA", the runtime's error, …).
std::string gpu_unavailable_reason();

/// Number of logical GPUs (physical ones, split per `config::set_logical_gpu_devices`).
int logical_gpu_count();
/// Physical GPU and sub-index behind logical GPU `index` (which must exist).
std::pair<int, int> logical_gpu_location(int index);
/// Marks GPUs as in use: the logical table can no longer change.
void mark_gpus_used();

}  // namespace mirrored::detail
