// Which backend serves a device, and copies between any two devices.
#include <cstring>
#include <vector>

#include "device/gpu/gpu_runtime.hpp"
#include "device/gpu/logical_gpus.hpp"
#include "device/host/host_backend.hpp"
#include "device/placement.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail {

// ---------------------------------------------------------------------------------------------
// Streams and events: what DeviceBackend gives every backend.

namespace {
// The calling thread's innermost StreamScope (scopes of all backends, innermost first).
thread_local const DeviceBackend::StreamScope* tl_innermost_scope = nullptr;

// The host backend's event: its work is complete when enqueued.
class ReachedEvent final : public DeviceEvent {
 public:
  bool query() const override { return true; }
  void synchronize(const Deadline&) const override {}
};
}  // namespace

DeviceBackend::StreamScope::StreamScope(const DeviceBackend& backend, StreamKind kind) noexcept
    : backend_(&backend), kind_(kind), outer_(tl_innermost_scope) {
  tl_innermost_scope = this;
}

DeviceBackend::StreamScope::~StreamScope() { tl_innermost_scope = outer_; }

StreamKind DeviceBackend::current_stream() const noexcept {
  for (const StreamScope* s = tl_innermost_scope; s; s = s->outer_)
    if (s->backend_ == this) return s->kind_;
  return StreamKind::compute;
}

double default_synchronize_timeout_s() {
  static const double timeout = env_positive("MIRRORED_COLLECTIVE_TIMEOUT_S", 1800.0);
  return timeout;
}

void DeviceBackend::synchronize() { synchronize_until(Deadline::after(default_synchronize_timeout_s())); }

std::unique_ptr<DeviceEvent> DeviceBackend::create_event() { return std::make_unique<ReachedEvent>(); }

void DeviceBackend::record_event(DeviceEvent&) {}

void DeviceBackend::wait_event(const DeviceEvent& event) {
  // Host work runs on the calling thread: "later work waits" means the caller waits now.
  event.synchronize(Deadline::after(default_synchronize_timeout_s()));
}

void DeviceBackend::record_stream_use(const void*, const DeviceBackend&) {}

// ---------------------------------------------------------------------------------------------
// Which backend serves a device.

DeviceBackend& backend_for(const Device& device) {
  if (device.is_host()) return host_backend();
  const int visible = logical_gpu_count();
  auto& runtime = gpu_runtime();
  MIRRORED_ENFORCE(device.index() < visible, NotFoundError, "Device ", device.to_string(), " not found: ", visible,
                   " GPUs are visible (", runtime.unavailable_reason(), ")");
  mark_gpus_used();
  return runtime.backend(device);
}

void copy_between(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_host() && src_device.is_host()) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (same_backend(dst_device, src_device)) {
    // Ordered on the device's stream like a kernel: whoever uses `dst` there comes after it, and
    // a host read synchronizes first anyway, so the host need not wait here.
    backend_for(dst_device).copy_within(dst, src, bytes);
    return;
  }
  if (dst_device.is_host()) {
    auto& be = backend_for(src_device);
    be.synchronize();
    be.copy_to_host(dst, src, bytes);
    return;
  }
  if (src_device.is_host()) {
    auto& be = backend_for(dst_device);
    be.copy_from_host(dst, src, bytes);
    be.synchronize();
    return;
  }
  // GPU to another GPU: a same-chip or peer copy where the platform has one.
  if (gpu_runtime().copy_gpu_to_gpu(dst, dst_device, src, src_device, bytes)) return;
  // Device to another device: stage through host memory.
  std::vector<unsigned char> staging(bytes);
  auto& from = backend_for(src_device);
  from.synchronize();
  from.copy_to_host(staging.data(), src, bytes);
  auto& to = backend_for(dst_device);
  to.copy_from_host(dst, staging.data(), bytes);
  to.synchronize();
}

void prefetch_between(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                      std::size_t bytes) {
  if (bytes == 0) return;
  if (src_device.is_host() && !dst_device.is_host()) {
    backend_for(dst_device).prefetch_from_host(dst, src, bytes);
    return;
  }
  copy_between(dst, dst_device, src, src_device, bytes);
}

}  // namespace mirrored::detail

namespace mirrored {

TransferCounts transfer_counts(const Device& device) { return detail::backend_for(device).transfer_counts(); }

}  // namespace mirrored
