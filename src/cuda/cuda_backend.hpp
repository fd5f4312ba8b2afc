#pragma once
// Private: the CUDA device backend (one per logical GPU) and the helpers the CUDA part shares.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "cuda/caching_allocator.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// "GPU:1 (physical GPU 0), replica 1": where a CUDA call ran, for messages (the replica when the
/// calling thread is inside a strategy's run).
std::string describe_gpu_call_site(const Device& logical, int physical);

/// Throws the mirrored error for a failed CUDA call: UnavailableError for out-of-memory and
/// missing/unavailable devices, InternalError otherwise; the message names the call, the device
/// and the replica. Clears the runtime's last error.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const Device& logical, int physical);

/// Makes `physical` the calling thread's current device for a scope, restoring the previous one.
class CudaDeviceGuard {
 public:
  /// \throws like throw_cuda_error when the device cannot be made current.
  CudaDeviceGuard(int physical, const Device& logical);
  /// Best effort (never throws): `ok()` tells whether the device is current.
  CudaDeviceGuard(int physical, std::nothrow_t) noexcept;
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;
  bool ok() const noexcept { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = true;
};

/// cudaMalloc / cudaFree of one physical GPU, for the caching allocator.
struct CudaMemoryPolicy {
  Device logical;
  int physical = 0;
  void* allocate(std::size_t bytes);
  void free(void* p, std::size_t bytes) noexcept;
  std::string describe() const;
};

class CudaBackend final : public DeviceBackend {
 public:
  /// Creates the stream, events and allocator of logical GPU `logical` (on physical GPU
  /// `physical`). \throws like throw_cuda_error.
  CudaBackend(const Device& logical, int physical);
  ~CudaBackend() override;  // never runs: backends live as long as the process

  const Device& device() const noexcept override { return logical_; }
  int physical() const noexcept { return physical_; }
  /// The stream every operation of this device is ordered on (non-blocking w.r.t. the legacy
  /// default stream).
  cudaStream_t stream() const noexcept { return stream_; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  /// One cudaMemcpy2DAsync on the stream.
  void copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                        std::size_t height) override;
  /// On this device's copy stream (created on first use), after the work already queued on the
  /// main stream that may still use `dst`'s memory; a source inside a large host block is copied
  /// directly once the block is pinned (it stays pinned while the host cache recycles it).
  void prefetch_from_host(void* dst, const void* src, std::size_t bytes) override;
  void fill(DType dtype, void* dst, int64_t count, const void* value) override;
  void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
              int64_t count) override;
  void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) override;
  void sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) override;
  void divide(DType dtype, void* inout, int64_t count, int64_t divisor) override;
  void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) override;
  void synchronize() override;

  /// Throws for a failed call on this device (no-op on success).
  void check(cudaError_t err, const char* call) const {
    if (err != cudaSuccess) throw_cuda_error(err, call, logical_, physical_);
  }
  /// Events the same-chip all-reduce records on this stream ("my inputs are ready", "the
  /// outputs are written"); see on_chip_all_reduce.cpp.
  cudaEvent_t ready_event() const noexcept { return ready_event_; }
  cudaEvent_t done_event() const noexcept { return done_event_; }

  /// Returns the allocator's cached blocks to the device.
  void release_cached() noexcept { allocator_.release_cached(); }
  CachingAllocatorStats allocator_stats() const { return allocator_.stats(); }

  /// Copies of this many bytes and more skip the staging buffers when the host side is already
  /// pinned (page-locked) memory.
  static constexpr std::size_t kDirectCopyMin = std::size_t{1} << 20;
  /// Pinned staging: slots of this size, used round-robin.
  static constexpr std::size_t kSlotBytes = std::size_t{4} << 20;
  static constexpr int kSlots = 4;

 private:
  struct Slot {
    unsigned char* host = nullptr;
    cudaEvent_t event = nullptr;
    bool pending = false;  // a copy from/into it may still be running
  };
  /// A stream with pinned staging slots of its own: the main lane orders every operation of the
  /// device, the prefetch lane carries the input pipeline's copies.
  struct Lane {
    cudaStream_t stream = nullptr;
    std::mutex mu;
    Slot slots[kSlots];
    int slot = 0;          // the slot host-to-device copies are filling
    std::size_t used = 0;  // bytes of it already used
  };
  void ensure_staging_locked(Lane& lane);
  void wait_slot_locked(Slot& s);
  int next_slot_locked(Lane& lane);
  /// Host-to-device through the lane's slots; returns once the source is staged.
  void stage_to_device_locked(Lane& lane, void* dst, const void* src, std::size_t bytes);
  bool is_pinned(const void* p) const;

  Device logical_;
  int physical_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_event_ = nullptr;
  cudaEvent_t done_event_ = nullptr;
  CachingAllocator<CudaMemoryPolicy> allocator_;

  Lane main_;
  Lane prefetch_;                         // its stream is created by the first prefetch
  cudaEvent_t prefetch_order_ = nullptr;  // "main-stream work so far", waited for by the prefetch lane

  std::mutex div_mu_;
  unsigned long long* div_flag_ = nullptr;       // device: smallest index of an integer division by zero
  unsigned long long* div_flag_host_ = nullptr;  // pinned
};

/// The backend of logical GPU `index` (created on first use). \throws NotFoundError when there
/// is no such GPU.
CudaBackend& cuda_backend(int index);
/// The backend of a GPU device.
CudaBackend& cuda_backend(const Device& device);

/// Pins the large host-allocator block holding `p` (src/host_allocator.hpp) for direct DMA, once;
/// it is unpinned just before the allocator frees it. False when `p` is in no such block or the
/// driver refuses (the caller then stages the copy).
bool pin_host_block(const void* p, const Device& logical, int physical);

/// The same-chip all-reduce of logical GPUs (on_chip_all_reduce.cpp); see
/// GpuRuntime::all_reduce_on_chip.
bool on_chip_all_reduce(ReduceOp op, CollectiveStep& step);

}  // namespace mirrored::detail
