#pragma once
/// \file
/// The device-memory interface every tensor and collective goes through. A backend owns the memory
/// of one device and the kernels that run there; the host backend serves every `CPU:k`, and a GPU
/// backend registers itself per GPU (so a GPU replica is a new backend, not a rewrite).
/// Needed by `Tensor<T>` (<mirrored/tensor.hpp>), the optimizers' fused update
/// (<mirrored/optimizers.hpp>) and <mirrored/nn.hpp>.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "mirrored/deadline.hpp"
#include "mirrored/detail/binary_op.hpp"
#include "mirrored/detail/optimizer_update.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"

namespace mirrored::detail {

/// One variable's copy in a fused update: `count` elements of the parameter, its gradient and
/// the slots the optimizer kind uses (nullptr otherwise), all memory of the updating backend.
struct UpdateSegment {
  void* param = nullptr;
  const void* grad = nullptr;
  void* slot[kMaxOptimizerSlots] = {};  ///< slot k of the kind (optimizer_slot_count), nullptr past them
  int64_t count = 0;
};

/// Applies the formula of `u.kind` to one segment of host memory (float32 or float64) at 1-based
/// `step`: the built-in optimizers' per-variable update, the very code of the host backend's fused
/// update, so the two agree to the bit. \throws InvalidArgumentError for another dtype or an unknown
/// kind.
void apply_formula_on_host(DType dtype, const OptimizerUpdate& u, const UpdateSegment& segment, int64_t step);

/// Segments one `apply_optimizer` call takes at most (a CUDA launch passes them as its argument).
inline constexpr int kMaxUpdateSegments = 48;

/// Bytes and waits between the host and one backend (mirrored::TransferCounts, device.hpp).
using TransferCounts = mirrored::TransferCounts;

/// The streams of a device backend. Work enqueued on one stream runs in the order it was
/// enqueued; work on different streams runs concurrently unless events order it.
enum class StreamKind : unsigned char {
  compute,        ///< where every operation goes by default
  communication,  ///< for collectives that overlap computation (select it with a StreamScope)
};

/// A marker in a stream's work, like a CUDA event: `DeviceBackend::record_event` places it after
/// the work enqueued so far on the calling thread's stream, and it is *reached* once that work has
/// finished. An event that was never recorded counts as reached. Made by
/// `DeviceBackend::create_event`; may be used from any thread.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  /// True when the work before its latest record has finished.
  virtual bool query() const = 0;
  /// Blocks until `query()` would be true. \throws DeadlineExceededError past `deadline` (the
  /// work goes on); InternalError when the device failed.
  virtual void synchronize(const Deadline& deadline) const = 0;
};

/// Memory, copies and kernels of one device. Work is ordered on the backend's streams (the
/// compute stream unless a `StreamScope` selects another); host backends run it synchronously.
/// Callers call `synchronize()` before the host reads results. Host memory an operation takes as
/// an argument (a fill value, an array of input pointers) is read before it returns.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  /// While it lives, this backend's operations called from the constructing thread are enqueued
  /// on stream `kind` (and memory allocated meanwhile belongs to that stream). Scopes nest; they
  /// change nothing for other threads or other backends. Destroy it on the constructing thread.
  class StreamScope {
   public:
    StreamScope(const DeviceBackend& backend, StreamKind kind) noexcept;
    ~StreamScope();
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;

   private:
    friend class DeviceBackend;
    const DeviceBackend* backend_;
    StreamKind kind_;
    const StreamScope* outer_;
  };
  /// The stream this backend's operations called from the calling thread go to.
  StreamKind current_stream() const noexcept;

  /// Device this backend serves.
  virtual const Device& device() const noexcept = 0;
  /// Allocates `bytes` bytes of device memory (at least 64-byte aligned). \throws UnavailableError
  /// when the device is out of memory.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Returns memory obtained from `allocate`.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;

  /// Copies from host memory into this device's memory, ordered on the stream. The source has been
  /// read when it returns (the caller may reuse or free it at once); the copy into `dst` happens
  /// in stream order (call `synchronize()` before the host relies on it).
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;
  /// Copies from this device's memory into host memory; complete when it returns. It is *not*
  /// ordered after work queued on the stream: call `synchronize()` first when such work writes
  /// `src`.
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  /// Copies within this device.
  virtual void copy_within(void* dst, const void* src, std::size_t bytes) = 0;
  /// Copies `height` rows of `width` bytes within this device: row k goes from
  /// `src + k * src_pitch` to `dst + k * dst_pitch` (gathering and concatenating along inner
  /// axes). Ordered like `copy_within`; the default copies row by row with it.
  virtual void copy_rows_within(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                std::size_t width, std::size_t height) {
    for (std::size_t k = 0; k < height; ++k) {
      copy_within(static_cast<unsigned char*>(dst) + k * dst_pitch,
                  static_cast<const unsigned char*>(src) + k * src_pitch, width);
    }
  }
  /// Copies host memory into `dst`, a block allocated on this device after every earlier use of
  /// it was enqueued, for input prefetching. Where the device has streams, the copy runs on a copy
  /// stream of its own (pinning the source's host block when it can) after only the work queued
  /// on the backend's stream before this call (which may still use the block's memory), so it
  /// overlaps whatever is enqueued there afterwards: a pipeline one step ahead copies batch k+1
  /// while step k computes. Complete on return. The default is `copy_from_host` followed by
  /// `synchronize`.
  virtual void prefetch_from_host(void* dst, const void* src, std::size_t bytes) {
    copy_from_host(dst, src, bytes);
    synchronize();
  }

  /// Sets `count` elements of `dst` to `*value` (a host pointer to one element of `dtype`).
  virtual void fill(DType dtype, void* dst, int64_t count, const void* value) = 0;
  /// `out[i] = a[i or 0] op b[i or 0]`; a scalar operand is broadcast (its index is always 0).
  /// Integer division by zero throws InvalidArgumentError ("div: integer division by zero at
  /// element i"): the host backend at once; a backend with streams does not wait for the kernel
  /// but keeps what it found on the stream, with the replica that enqueued it (and the device and
  /// replica in the message), until a `synchronize` of that stream by that replica's thread (or by
  /// a thread outside every replica) throws it: a wait of another replica's thread on this stream
  /// (a collective reading this replica's data) leaves it, so the error surfaces on the replica
  /// whose kernel found it, and only there, once.
  virtual void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
                      int64_t count) = 0;
  /// `out[i] = in[0][i] + in[1][i] + ... + in[n-1][i]`, summed in that order so that results are
  /// bitwise reproducible. `out` may alias any input.
  virtual void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) = 0;
  /// `sum_n`, then, when `mean_divisor` > 0, `divide` by it (MEAN). A backend that fuses the two
  /// divides float16 and bfloat16 sums in float before their one rounding (the host backend does);
  /// this default rounds the sum, then the quotient.
  virtual void sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                          int64_t mean_divisor) {
    sum_n(dtype, inputs, num_inputs, out, count);
    if (mean_divisor > 0) divide(dtype, out, count, mean_divisor);
  }
  /// Sums along the middle axis of a `[outer, length, inner]` row-major array into `[outer, inner]`,
  /// in index order (`length` may be 0: the result is then zeros).
  virtual void sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) = 0;
  /// `inout[i] /= divisor` (integer types divide and truncate).
  virtual void divide(DType dtype, void* inout, int64_t count, int64_t divisor) = 0;
  /// Converts `count` elements from `src_dtype` to `dst_dtype` (as `static_cast` does).
  virtual void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) = 0;

  /// One pass of optimizer `u` over every segment ("multi-tensor apply"), ordered on the calling
  /// thread's stream like any kernel: each parameter and its slots are updated in place from its
  /// gradient. `step_in` (device memory of this backend) holds the updates applied so far; the
  /// update uses step `*step_in + 1` (Adam's bias correction) and, when `step_out` is not null,
  /// writes that step there (`step_out` must not be `step_in`: a GPU's blocks read the step while
  /// others write it), so the step count never has to be read by the host. `dtype` is
  /// float32 or float64; segments must not overlap; `num_segments` <= kMaxUpdateSegments (0 only
  /// writes the step). The host backend's results equal the per-variable update of
  /// optimizers.hpp bit for bit; a GPU's may differ in the last bits (contracted multiply-adds).
  virtual void apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                               const int64_t* step_in, int64_t* step_out) = 0;

  /// What crossed between the host and this device so far (all zeros for the host backend, whose
  /// memory is the host's). Safe from any thread.
  TransferCounts transfer_counts() const noexcept {
    return {h2d_bytes_.load(std::memory_order_relaxed), d2h_bytes_.load(std::memory_order_relaxed),
            host_syncs_.load(std::memory_order_relaxed)};
  }

  /// Blocks until all work enqueued on the calling thread's stream has finished, by `deadline`
  /// (the calling collective's, or one made for this wait). \throws DeadlineExceededError past it
  /// (naming the device; the work goes on), InternalError when the device failed,
  /// InvalidArgumentError for an integer division by zero that a kernel on this stream found and
  /// that belongs to the calling replica (see `binary`).
  virtual void synchronize_until(const Deadline& deadline) = 0;
  /// `synchronize_until`, except that an integer division by zero found on the stream is left for
  /// a later `synchronize` instead of thrown: for waits that only let kernels finish before memory
  /// is reused or released, on error paths that would swallow it (the failure being reported is
  /// another one). \throws DeadlineExceededError, InternalError as `synchronize_until`.
  virtual void wait_keeping_flags(const Deadline& deadline) { synchronize_until(deadline); }
  /// `synchronize_until` the default timeout from now (`MIRRORED_COLLECTIVE_TIMEOUT_S`, 1800 s).
  void synchronize();

  /// A new event of this backend (see DeviceEvent). The host backend's is always reached.
  virtual std::unique_ptr<DeviceEvent> create_event();
  /// Records `event` (made by this backend) after the work enqueued so far on the calling thread's
  /// stream, replacing its earlier record. The host backend does nothing: its work is complete.
  virtual void record_event(DeviceEvent& event);
  /// Work enqueued on the calling thread's stream after this call starts only once `event` (made by
  /// any backend of the same platform, e.g. another stream or another GPU) is reached, as its latest
  /// record before this call stands. Returns at once on a device; the host backend blocks until the
  /// event is reached (default deadline).
  virtual void wait_event(const DeviceEvent& event);
  /// Notes that work enqueued so far on `user`'s stream for the calling thread (`user`: a backend of
  /// the same platform, this one or another logical GPU of the chip) uses `block`, a block this
  /// backend allocated: once freed, it is handed out again only after that work has finished
  /// (CUDA's `record_stream`). Blocks used only on the stream they were allocated for need no
  /// record. Nothing on the host backend.
  virtual void record_stream_use(const void* block, const DeviceBackend& user);

  /// Backends with memory of their own (and their events) count what crosses with these.
  void count_host_to_device(std::size_t bytes) noexcept { h2d_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void count_device_to_host(std::size_t bytes) noexcept { d2h_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void count_host_sync() noexcept { host_syncs_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> h2d_bytes_{0}, d2h_bytes_{0}, host_syncs_{0};
};

/// The deadline of `DeviceBackend::synchronize()` (`MIRRORED_COLLECTIVE_TIMEOUT_S`, default 1800 s).
double default_synchronize_timeout_s();

/// The backend serving `device`: the host backend for every `CPU:k`, the GPU runtime's for a GPU.
/// \throws NotFoundError for a GPU that is not visible (none is in a build without CUDA).
DeviceBackend& backend_for(const Device& device);

/// Copies `bytes` bytes between any two devices (host staging where needed). A copy within one
/// device is enqueued on the calling thread's stream there, like a kernel, without a host wait
/// (read `dst` from the host only after `synchronize()`); every other copy is complete on return.
void copy_between(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes);

/// `copy_between` for the input pipeline: a host-to-device copy into a freshly allocated `dst`
/// goes through `prefetch_from_host` (off the device's main stream); anything else is
/// `copy_between`. Complete on return.
void prefetch_between(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                      std::size_t bytes);

}  // namespace mirrored::detail
