#pragma once
// Private: the host's fused optimizer update (DeviceBackend::apply_optimizer), which the host
// backend runs at once and the simulated GPU runs on its streams.
#include <cstdint>

#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {

/// `DeviceBackend::apply_optimizer` on host memory, synchronously. Each element's update is the
/// expression of the per-variable update in optimizers.hpp, evaluated in the same order, so the
/// results are bitwise equal to it; the loops are written so that the compiler vectorises them.
/// \throws InvalidArgumentError for a dtype other than float32/float64 or too many segments.
void host_apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                          const int64_t* step_in, int64_t* step_out);

/// Checks `apply_optimizer`'s arguments the same way on every backend. \throws
/// InvalidArgumentError naming `device`.
void check_optimizer_arguments(const char* device, DType dtype, const OptimizerUpdate& u, int num_segments,
                               const int64_t* step_in, const int64_t* step_out);

}  // namespace mirrored::detail
