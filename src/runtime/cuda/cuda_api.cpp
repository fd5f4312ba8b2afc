// mirrored/cuda.hpp.
#include "mirrored/cuda.hpp"

#include "device/cuda/cuda_backend.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/replica_context.hpp"
#include "runtime/thread_state.hpp"

namespace mirrored::cuda {
namespace {
detail::CudaBackend& gpu(const Device& device, const char* what) {
  MIRRORED_ENFORCE(!device.is_host(), InvalidArgumentError, "mirrored::cuda::", what, ": ", device.to_string(),
                   " is not a GPU");
  // Through backend_for: the same visibility checks (and bookkeeping) as any tensor on the device.
  detail::backend_for(device);
  return detail::cuda_backend(device.index());
}
}  // namespace

cudaStream_t stream(const Device& device) { return gpu(device, "stream").stream(); }

cudaStream_t current_stream() {
  const ReplicaContext* ctx = detail::thread_state().replica;
  MIRRORED_ENFORCE(ctx != nullptr, FailedPreconditionError,
                   "mirrored::cuda::current_stream: not inside Strategy::run (use mirrored::cuda::stream(device))");
  const Device& d =
      ctx->strategy().extended().worker_devices()[static_cast<std::size_t>(detail::local_replica_index(*ctx))];
  MIRRORED_ENFORCE(!d.is_host(), FailedPreconditionError, "mirrored::cuda::current_stream: replica ",
                   ctx->replica_id_in_sync_group(), " runs on ", d.to_string(), ", not on a GPU");
  return gpu(d, "current_stream").stream();
}

int physical_device(const Device& device) { return gpu(device, "physical_device").physical(); }

AllocatorStats allocator_stats(const Device& device) {
  const auto s = gpu(device, "allocator_stats").allocator_stats();
  AllocatorStats out;
  out.allocations = s.allocations;
  out.cache_hits = s.cache_hits;
  out.device_allocations = s.device_allocations;
  out.bytes_in_use = s.bytes_in_use;
  out.bytes_cached = s.bytes_cached;
  out.peak_bytes_in_use = s.peak_bytes_in_use;
  return out;
}

void empty_cache(const Device& device) { gpu(device, "empty_cache").release_cached(); }

}  // namespace mirrored::cuda
