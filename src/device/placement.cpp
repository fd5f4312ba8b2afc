// Where devices live, answered from the logical-GPU table.
#include "device/placement.hpp"

#include "device/gpu/logical_gpus.hpp"

namespace mirrored::detail {

int physical_gpu_of(const Device& gpu) { return logical_gpu_location(gpu.index()).first; }

bool same_backend(const Device& a, const Device& b) {
  if (a.is_host() || b.is_host()) return a.is_host() && b.is_host();
  return a.index() == b.index();  // a GPU's backend is its logical index's, whatever job or task names it
}

bool same_memory(const Device& a, const Device& b) {
  if (same_backend(a, b)) return true;
  if (a.is_host() || b.is_host()) return false;
  return physical_gpu_of(a) == physical_gpu_of(b);
}

}  // namespace mirrored::detail
