// The core side of the CUDA hooks (see gpu_hooks.hpp). Compiled in every build.
#include "gpu_hooks.hpp"

#include <atomic>

#include "gpu_registry.hpp"

namespace mirrored::detail {
namespace {

std::atomic<void (*)(const Device&)> g_enter_device{nullptr};
std::atomic<void (*)(void*, const Device&, const void*, const Device&, std::size_t)> g_copy{nullptr};
std::atomic<bool (*)(ReduceOp, CollectiveStep&)> g_on_chip{nullptr};

}  // namespace

void install_gpu_hooks(const GpuHooks& hooks) noexcept {
  g_enter_device.store(hooks.enter_device, std::memory_order_release);
  g_copy.store(hooks.copy_gpu_to_gpu, std::memory_order_release);
  g_on_chip.store(hooks.all_reduce_on_chip, std::memory_order_release);
}

void enter_replica_device(const Device& device) {
  if (device.is_host()) return;
  if (auto* fn = g_enter_device.load(std::memory_order_acquire)) fn(device);
}

bool copy_gpu_to_gpu(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                     std::size_t bytes) {
  auto* fn = g_copy.load(std::memory_order_acquire);
  if (!fn) return false;
  fn(dst, dst_device, src, src_device, bytes);
  return true;
}

bool all_reduce_on_chip(ReduceOp op, CollectiveStep& step) {
  auto* fn = g_on_chip.load(std::memory_order_acquire);
  return fn != nullptr && fn(op, step);
}

bool same_memory(const Device& a, const Device& b) {
  if (a.is_host() && b.is_host()) return true;
  if (a == b) return true;
  if (a.is_host() || b.is_host()) return false;
  if (a.index() == b.index()) return true;  // the same GPU named with another job/task
  return logical_gpu_location(a.index()).first == logical_gpu_location(b.index()).first;
}

}  // namespace mirrored::detail
