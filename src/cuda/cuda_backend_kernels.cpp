// The CUDA device backend's kernels (element-wise ops, sums, division, casts): launches of
// kernels.cu on the calling thread's stream. Memory, copies, streams and events are in
// cuda_backend.cpp.
#include <limits>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {

void CudaBackend::fill(DType dtype, void* dst, int64_t count, const void* value) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::fill(dtype, dst, count, value, lane_for_call().stream), "fill kernel launch");
}

void CudaBackend::binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar,
                         void* out, int64_t count) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  Lane& lane = lane_for_call();
  const auto kop = static_cast<cuda_kernels::Binary>(static_cast<int>(op));
  if (op != BinaryOp::div || dtype_is_floating(dtype)) {
    check(cuda_kernels::binary(kop, dtype, a, a_scalar, b, b_scalar, out, count, nullptr, lane.stream),
          "binary kernel launch");
    return;
  }
  // Integer division: the kernel records the first zero divisor; raise it like the host does.
  std::lock_guard lock(div_mu_);
  if (!div_flag_) {
    // Both buffers or neither: made into locals and published together.
    void* d = nullptr;
    void* h = nullptr;
    const cudaError_t got_device = cudaMalloc(&d, sizeof(unsigned long long));
    const cudaError_t got_host =
        got_device == cudaSuccess ? cudaHostAlloc(&h, sizeof(unsigned long long), cudaHostAllocDefault) : got_device;
    if (got_host != cudaSuccess) {
      (void)cudaGetLastError();
      if (d && cudaFree(d) != cudaSuccess) (void)cudaGetLastError();
      check(got_host, got_device != cudaSuccess ? "cudaMalloc" : "cudaHostAlloc");
    }
    div_flag_host_ = static_cast<unsigned long long*>(h);
    div_flag_ = static_cast<unsigned long long*>(d);
  }
  // Reset on this call's stream, so no state carries over from a call on another stream.
  check(cudaMemsetAsync(div_flag_, 0xFF, sizeof(unsigned long long), lane.stream), "cudaMemsetAsync");
  check(cuda_kernels::binary(kop, dtype, a, a_scalar, b, b_scalar, out, count, div_flag_, lane.stream),
        "div kernel launch");
  check(cudaMemcpyAsync(div_flag_host_, div_flag_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, lane.stream),
        "cudaMemcpyAsync");
  wait_lane(lane, "div (cudaStreamQuery)");
  const unsigned long long at = *div_flag_host_;
  if (at != std::numeric_limits<unsigned long long>::max())
    throw InvalidArgumentError(str_cat("div: integer division by zero at element ", at));
}

void CudaBackend::sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(num_inputs >= 1, InternalError, "sum_n on ", logical_.short_name(), " with ", num_inputs, " inputs");
  CudaDeviceGuard guard(physical_, logical_);
  const cudaStream_t stream = lane_for_call().stream;
  constexpr int kMax = cuda_kernels::kMaxSumInputs;
  if (num_inputs <= kMax) {
    check(cuda_kernels::sum_n(dtype, inputs, num_inputs, nullptr, out, count, stream), "sum_n kernel launch");
    return;
  }
  // More inputs than one launch takes: accumulate into scratch, in order; the last launch writes
  // `out` (which may alias an input, so it is written only once every input has been read).
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  void* scratch = allocator_.allocate(bytes, stream);
  struct Release {
    CachingAllocator<CudaMemoryPolicy>& a;
    void* p;
    ~Release() { a.deallocate(p); }  // stream-ordered: later users of the block come after
  } release{allocator_, scratch};
  check(cuda_kernels::sum_n(dtype, inputs, kMax, nullptr, scratch, count, stream), "sum_n kernel launch");
  int next = kMax;
  while (num_inputs - next > kMax) {
    check(cuda_kernels::sum_n(dtype, inputs + next, kMax, scratch, scratch, count, stream), "sum_n kernel launch");
    next += kMax;
  }
  check(cuda_kernels::sum_n(dtype, inputs + next, num_inputs - next, scratch, out, count, stream),
        "sum_n kernel launch");
}

void CudaBackend::sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out) {
  if (outer * inner <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::sum_axis(dtype, in, outer, length, inner, out, lane_for_call().stream), "sum_axis kernel launch");
}

void CudaBackend::divide(DType dtype, void* inout, int64_t count, int64_t divisor) {
  if (!dtype_is_floating(dtype))
    MIRRORED_ENFORCE(divisor != 0, InvalidArgumentError, "divide: integer division by zero");
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::divide(dtype, inout, count, divisor, lane_for_call().stream), "divide kernel launch");
}

void CudaBackend::cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) {
  if (count <= 0) return;
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::cast(src_dtype, src, dst_dtype, dst, count, lane_for_call().stream), "cast kernel launch");
}

}  // namespace mirrored::detail
