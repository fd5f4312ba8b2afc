#pragma once
// Private: the host backend, which serves every CPU:k.
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {

/// The one host backend (synchronous; memory from the host allocator).
DeviceBackend& host_backend();

}  // namespace mirrored::detail
