#pragma once
/// \file
/// The device-memory interface every tensor and collective goes through. A backend owns the memory
/// of one device and the kernels that run there; the host backend serves every `CPU:k`, and a GPU
/// backend registers itself per GPU (so a GPU replica is a new backend, not a rewrite).

#include <cstddef>
#include <cstdint>

#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"

namespace mirrored::detail {

/// Element-wise binary operations of the Tensor operators.
enum class BinaryOp { add, sub, mul, div };

/// Memory, copies and kernels of one device. Work is ordered on the backend's stream; host
/// backends run it synchronously. Callers call `synchronize()` before the host reads results.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  /// Device this backend serves.
  virtual const Device& device() const noexcept = 0;
  /// Allocates `bytes` bytes of device memory (at least 64-byte aligned). \throws UnavailableError
  /// when the device is out of memory.
  virtual void* allocate(std::size_t bytes) = 0;
  /// Returns memory obtained from `allocate`.
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;

  /// Copies from host memory into this device's memory.
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;
  /// Copies from this device's memory into host memory; complete when it returns.
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
  virtual void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
                      int64_t count) = 0;
  /// `out[i] = in[0][i] + in[1][i] + ... + in[n-1][i]`, summed in that order so that results are
  /// bitwise reproducible. `out` may alias any input.
  virtual void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) = 0;
  /// Sums along the middle axis of a `[outer, length, inner]` row-major array into `[outer, inner]`,
  /// in index order (`length` may be 0: the result is then zeros).
  virtual void sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) = 0;
  /// `inout[i] /= divisor` (integer types divide and truncate).
  virtual void divide(DType dtype, void* inout, int64_t count, int64_t divisor) = 0;
  /// Converts `count` elements from `src_dtype` to `dst_dtype` (as `static_cast` does).
  virtual void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) = 0;
  /// Blocks until all work enqueued on this backend's stream has finished.
  virtual void synchronize() = 0;
};

/// The backend serving `device`: the host backend for every `CPU:k`, the GPU runtime's for a GPU.
/// \throws NotFoundError for a GPU that is not visible (none is in a build without CUDA).
DeviceBackend& backend_for(const Device& device);

/// Copies `bytes` bytes between any two devices (host staging where needed). Complete on return.
void copy_between(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes);

/// `copy_between` for the input pipeline: a host-to-device copy into a freshly allocated `dst`
/// goes through `prefetch_from_host` (off the device's main stream); anything else is
/// `copy_between`. Complete on return.
void prefetch_between(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                      std::size_t bytes);

}  // namespace mirrored::detail
