// The device questions of <mirrored/dlpack.hpp> (DLPack names a GPU by its CUDA ordinal, the
// library by its logical index). Compiled without DLPack's header: only ints cross.
#include <optional>

#include "device/gpu/logical_gpus.hpp"
#include "mirrored/detail/dlpack_devices.hpp"
#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {

int dlpack_cuda_ordinal(const Device& gpu) {
  MIRRORED_ENFORCE(!gpu.is_host(), InvalidArgumentError, "dlpack_cuda_ordinal: ", gpu.short_name(), " is not a GPU");
  return logical_gpu_location(gpu.index()).first;
}

std::optional<Device> dlpack_gpu_of_ordinal(int ordinal) {
  const int n = logical_gpu_count();
  for (int i = 0; i < n; ++i)
    if (logical_gpu_location(i).first == ordinal) return Device(DeviceType::GPU, i);
  return std::nullopt;
}

int dlpack_gpu_count() { return logical_gpu_count(); }

}  // namespace mirrored::detail
