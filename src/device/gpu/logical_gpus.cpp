// The logical-GPU table over the GPU runtime's physical GPUs.
#include "device/gpu/logical_gpus.hpp"

#include <map>
#include <mutex>

#include "device/gpu/gpu_runtime.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {
namespace detail {
namespace {

struct LogicalGpus {
  std::mutex mu;
  std::map<int, int> splits;  // physical GPU → number of logical GPUs (default 1)
  bool used = false;
};
LogicalGpus& logical_gpus() {
  static LogicalGpus table;
  return table;
}

}  // namespace

int logical_gpu_count() {
  const int physical = gpu_runtime().physical_gpu_count();
  auto& t = logical_gpus();
  std::lock_guard lock(t.mu);
  int n = 0;
  for (int p = 0; p < physical; ++p) {
    auto it = t.splits.find(p);
    n += it == t.splits.end() ? 1 : it->second;
  }
  return n;
}

std::pair<int, int> logical_gpu_location(int index) {
  const int physical = gpu_runtime().physical_gpu_count();
  auto& t = logical_gpus();
  std::lock_guard lock(t.mu);
  const int asked = index;
  for (int p = 0; p < physical; ++p) {
    auto it = t.splits.find(p);
    const int count = it == t.splits.end() ? 1 : it->second;
    if (index < count) return {p, index};
    index -= count;
  }
  throw NotFoundError(str_cat("logical GPU ", asked, " does not exist (", physical, " physical GPUs)"));
}

void mark_gpus_used() {
  auto& t = logical_gpus();
  std::lock_guard lock(t.mu);
  t.used = true;
}

}  // namespace detail

namespace config {
void set_logical_gpu_devices(int physical_gpu, int count) {
  MIRRORED_ENFORCE(count >= 1, InvalidArgumentError, "set_logical_gpu_devices: count must be at least 1, got ", count);
  auto& runtime = detail::gpu_runtime();
  const int physical = runtime.physical_gpu_count();
  MIRRORED_ENFORCE(physical_gpu >= 0 && physical_gpu < physical, NotFoundError,
                   "set_logical_gpu_devices: physical GPU ", physical_gpu, " not found: ", physical,
                   " GPUs are visible (", runtime.unavailable_reason(), ")");
  auto& t = detail::logical_gpus();
  std::lock_guard lock(t.mu);
  MIRRORED_ENFORCE(!t.used, FailedPreconditionError,
                   "set_logical_gpu_devices: logical devices cannot be modified after GPUs have been used");
  t.splits[physical_gpu] = count;
}
}  // namespace config

}  // namespace mirrored
