#pragma once
// Private: the CUDA device backend (one per logical GPU) and the helpers the CUDA part shares.

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "device/gpu/caching_allocator.hpp"
#include "device/gpu/gpu_backend.hpp"
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {

/// True for the CUDA errors that leave the process's context unusable ("any further CUDA work will
/// return the same error; the process must be terminated and relaunched"): illegal address,
/// launch failure and timeout, device assert, hardware stack error, illegal or misaligned
/// instruction, invalid address space or PC, tensor memory leak, MPS client terminated.
bool cuda_error_is_sticky(cudaError_t err) noexcept;

/// Throws the mirrored error for a failed CUDA call: UnavailableError for out-of-memory and
/// missing/unavailable devices, InternalError otherwise; the message names the call, the device
/// and the replica. A sticky error also marks the physical GPU unusable (mark_gpu_unusable), so
/// that later work is refused with FailedPreconditionError instead of failing somewhere else.
/// Clears the runtime's last error.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const Device& logical, int physical);

/// Makes `physical` the calling thread's current device for a scope, restoring the previous one.
class CudaDeviceGuard {
 public:
  /// \throws FailedPreconditionError when a sticky error made the GPU unusable; like
  /// throw_cuda_error when the device cannot be made current.
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

/// Waits for `stream` (cudaStreamQuery, polled) until `deadline`. \throws DeadlineExceededError
/// naming `what` and the device past it; like throw_cuda_error for a failed query.
void wait_cuda_stream(cudaStream_t stream, std::chrono::steady_clock::time_point deadline, double timeout_s,
                      const char* what, const Device& logical, int physical);

/// cudaMalloc / cudaFree and the events of one physical GPU, for the caching allocator.
struct CudaMemoryPolicy {
  using Stream = cudaStream_t;
  using Event = cudaEvent_t;
  Device logical;
  int physical = 0;
  void* allocate(std::size_t bytes);
  void free(void* p, std::size_t bytes) noexcept;
  std::string describe() const;
  bool record_event(Stream s, Event& e) noexcept;
  bool event_reached(const Event& e) noexcept;
  void synchronize_event(const Event& e) noexcept;
  void destroy_event(Event& e) noexcept;
  void synchronize_stream(Stream s) noexcept;
};

/// A DeviceEvent of a CUDA device (cudaEvent_t without timing).
class CudaEvent final : public DeviceEvent {
 public:
  /// \throws like throw_cuda_error. `counts` (when given) counts each host wait.
  CudaEvent(const Device& logical, int physical, DeviceBackend* counts = nullptr);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const noexcept { return event_; }
  bool query() const override;
  /// Polls cudaEventQuery up to the deadline.
  void synchronize(const Deadline& deadline) const override;

 private:
  Device logical_;
  int physical_;
  DeviceBackend* counts_;
  cudaEvent_t event_ = nullptr;
};

class CudaBackend final : public GpuBackend {
 public:
  /// Creates the stream, events and allocator of logical GPU `logical` (on physical GPU
  /// `physical`). \throws like throw_cuda_error (having released what it made).
  CudaBackend(const Device& logical, int physical);
  ~CudaBackend() override;  // never runs: backends live as long as the process

  const Device& device() const noexcept override { return logical_; }
  int physical() const noexcept override { return physical_; }
  /// The compute stream: every operation of this device is ordered on it unless a StreamScope
  /// selects the communication stream (non-blocking w.r.t. the legacy default stream).
  cudaStream_t stream() const noexcept { return main_.stream; }
  /// The calling thread's stream of this backend (the communication stream is made on first use).
  cudaStream_t stream_for_call() { return lane_for_call().stream; }

  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  /// One cudaMemcpy2DAsync on the stream.
  void copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width,
                        std::size_t height) override;
  /// On this device's copy stream (created on first use), after the work already queued on the
  /// calling thread's stream that may still use `dst`'s memory; a source inside a large host block
  /// is copied directly once the block is pinned (it stays pinned while the host cache recycles it).
  void prefetch_from_host(void* dst, const void* src, std::size_t bytes) override;
  void fill(DType dtype, void* dst, int64_t count, const void* value) override;
  void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
              int64_t count) override;
  void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) override;
  /// One launch (chain) that divides before its rounding, as the host backend: float16/bfloat16
  /// MEAN rounds once.
  void sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                  int64_t mean_divisor) override;
  void sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) override;
  void divide(DType dtype, void* inout, int64_t count, int64_t divisor) override;
  void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) override;
  /// One kernel launch; the segments travel as its argument and the step is read on the device.
  void apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                       const int64_t* step_in, int64_t* step_out) override;
  /// Polls the calling thread's stream (cudaStreamQuery) up to the deadline; then raises an
  /// integer division by zero that a kernel on that stream found (InvalidArgumentError) when the
  /// calling thread is the replica that launched it (or outside every replica).
  void synchronize_until(const Deadline& deadline) override;
  /// Polls like synchronize_until, and leaves a division by zero for a later synchronize.
  void wait_keeping_flags(const Deadline& deadline) override;

  std::unique_ptr<DeviceEvent> create_event() override;
  void record_event(DeviceEvent& event) override;
  void wait_event(const DeviceEvent& event) override;
  void record_stream_use(const void* block, const DeviceBackend& user) override;

  int max_fused_replicas() const noexcept override;
  void all_reduce_fused(DType dtype, const void* const* in, void* const* out, int n, int64_t count,
                        int64_t mean_divisor) override;
  DeviceEvent& ready_event() override { return *ready_event_; }
  DeviceEvent& done_event() override { return *done_event_; }

  /// Throws for a failed call on this device (no-op on success).
  void check(cudaError_t err, const char* call) const {
    if (err != cudaSuccess) throw_cuda_error(err, call, logical_, physical_);
  }

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
  /// device, the communication lane those a StreamScope sends there, the prefetch lane carries
  /// the input pipeline's copies.
  struct Lane {
    cudaStream_t stream = nullptr;
    std::mutex mu;
    bool staging = false;  // every slot below exists (they are made together, or not at all)
    Slot slots[kSlots];
    int slot = 0;          // the slot host-to-device copies are filling
    std::size_t used = 0;  // bytes of it already used
    // Integer division by zero, found without a host wait: the kernels lower `div_flag` (device
    // memory, UINT64_MAX while none was found) to the smallest such index, a copy after each
    // division lands it in `div_flag_host` (pinned) in stream order, and synchronize_until reads it
    // once the stream has finished. Made together on the first division (under `mu`).
    unsigned long long* div_flag = nullptr;
    unsigned long long* div_flag_host = nullptr;
    bool div_pending = false;  // a division ran since the last check
    // The replica that launched the first division since the last check (-1: outside every
    // replica): only that replica's synchronize raises what the kernels found (naming it), so a
    // collective's wait on another replica's stream leaves it.
    int div_replica = -1;
  };
  Lane& lane_for_call();
  /// A lane made on first use: its stream (and, for prefetch, `order`) exist before it is published.
  Lane& lazy_lane(std::atomic<Lane*>& published, std::unique_ptr<Lane>& owner, cudaEvent_t* order);
  void ensure_staging_locked(Lane& lane);
  void wait_slot_locked(Slot& s);
  int next_slot_locked(Lane& lane);
  /// Host-to-device through the lane's slots; returns once the source is staged.
  void stage_to_device_locked(Lane& lane, void* dst, const void* src, std::size_t bytes);
  /// Waits for `lane`'s stream with the default deadline.
  void wait_lane(const Lane& lane, const char* what);
  /// After `lane`'s stream finished: throws the integer division by zero its kernels found since
  /// the last check (and clears it), unless the calling thread is another replica than the one
  /// that launched them (the flag then stays for that replica's synchronize).
  void raise_division_by_zero(Lane& lane);
  bool is_pinned(const void* p) const;

  Device logical_;
  int physical_;
  CachingAllocator<CudaMemoryPolicy> allocator_;
  Lane main_;
  std::unique_ptr<CudaEvent> ready_event_, done_event_;

  std::mutex lanes_mu_;  // making the lanes made on first use
  std::unique_ptr<Lane> communication_owner_, prefetch_owner_;
  std::atomic<Lane*> communication_{nullptr}, prefetch_{nullptr};
  cudaEvent_t prefetch_order_ = nullptr;  // "work so far", waited for by the prefetch lane (made with it)
};

/// The backend of logical GPU `index` (created on first use). \throws NotFoundError when there
/// is no such GPU, FailedPreconditionError when the process's GPUs are not CUDA's (simulated).
CudaBackend& cuda_backend(int index);
/// The backend of a GPU device.
CudaBackend& cuda_backend(const Device& device);

/// Pins the large host-allocator block holding `p` (src/host_allocator.hpp) for direct DMA, once;
/// it is unpinned just before the allocator frees it. False when `p` is in no such block or the
/// driver refuses (the caller then stages the copy).
bool pin_host_block(const void* p, const Device& logical, int physical);

}  // namespace mirrored::detail
