// The CUDA device backend's kernels (element-wise ops, sums, division, casts): launches of
// kernels.cu on the calling thread's stream. Memory, copies, streams and events are in
// cuda_backend.cpp.
#include <limits>

#include "device/cuda/cuda_backend.hpp"
#include "device/cuda/kernels.hpp"
#include "device/host/host_optimizer.hpp"
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
  // Integer division: the kernel records the first zero divisor on the device; the next
  // synchronize of this stream by the launching replica raises it (no host wait here).
  const int replica = calling_replica_id();
  std::lock_guard lock(lane.mu);
  if (!lane.div_flag) {
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
    *static_cast<unsigned long long*>(h) = std::numeric_limits<unsigned long long>::max();
    // In stream order, before any division of this lane.
    const cudaError_t reset = cudaMemsetAsync(d, 0xFF, sizeof(unsigned long long), lane.stream);
    if (reset != cudaSuccess) {
      (void)cudaGetLastError();
      if (cudaFree(d) != cudaSuccess) (void)cudaGetLastError();
      if (cudaFreeHost(h) != cudaSuccess) (void)cudaGetLastError();
      check(reset, "cudaMemsetAsync");
    }
    lane.div_flag_host = static_cast<unsigned long long*>(h);
    lane.div_flag = static_cast<unsigned long long*>(d);
  }
  check(cuda_kernels::binary(kop, dtype, a, a_scalar, b, b_scalar, out, count, lane.div_flag, lane.stream),
        "div kernel launch");
  check(cudaMemcpyAsync(lane.div_flag_host, lane.div_flag, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                        lane.stream),
        "cudaMemcpyAsync");
  count_device_to_host(sizeof(unsigned long long));
  if (!lane.div_pending) lane.div_replica = replica;  // the first division since the last check
  lane.div_pending = true;
}

void CudaBackend::raise_division_by_zero(Lane& lane) {
  const int caller = calling_replica_id();
  std::lock_guard lock(lane.mu);
  if (!lane.div_pending) return;
  // Another replica's wait (a collective reading this replica's data) leaves it for its owner.
  if (lane.div_replica >= 0 && caller >= 0 && caller != lane.div_replica) return;
  lane.div_pending = false;
  const unsigned long long at = *lane.div_flag_host;  // the stream has finished: final
  if (at == std::numeric_limits<unsigned long long>::max()) return;
  *lane.div_flag_host = std::numeric_limits<unsigned long long>::max();
  check(cudaMemsetAsync(lane.div_flag, 0xFF, sizeof(unsigned long long), lane.stream), "cudaMemsetAsync");
  throw InvalidArgumentError(str_cat("div: integer division by zero at element ", at, " on ",
                                     describe_gpu_call_site(logical_, physical_, lane.div_replica)));
}

void CudaBackend::sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) {
  sum_n_mean(dtype, inputs, num_inputs, out, count, 0);
}

void CudaBackend::sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                             int64_t mean_divisor) {
  if (count <= 0) return;
  MIRRORED_ENFORCE(num_inputs >= 1, InternalError, "sum_n on ", logical_.short_name(), " with ", num_inputs, " inputs");
  CudaDeviceGuard guard(physical_, logical_);
  const cudaStream_t stream = lane_for_call().stream;
  const int launches = cuda_kernels::sum_chain_launches(num_inputs);
  if (launches == 1) {
    check(cuda_kernels::sum_n(dtype, inputs, num_inputs, nullptr, out, count, stream, mean_divisor),
          "sum_n kernel launch");
    return;
  }
  // More inputs than one launch takes: a chain of launches accumulating into scratch, in order; the
  // last writes `out` (which may alias an input, so it is written only once every input was read).
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  void* scratch = allocator_.allocate(bytes, stream);
  struct Release {
    CachingAllocator<CudaMemoryPolicy>& a;
    void* p;
    ~Release() { a.deallocate(p); }  // stream-ordered: later users of the block come after
  } release{allocator_, scratch};
  for (int j = 0; j < launches; ++j) {
    const cuda_kernels::SumChainLink link = cuda_kernels::sum_chain_link(num_inputs, j);
    check(cuda_kernels::sum_n(dtype, inputs + link.first, link.count, link.accumulate ? scratch : nullptr,
                              link.last ? out : scratch, count, stream, link.last ? mean_divisor : 0),
          "sum_n kernel launch");
  }
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

static_assert(cuda_kernels::kMaxOptimizerSegments == kMaxUpdateSegments);

void CudaBackend::apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments,
                                  int num_segments, const int64_t* step_in, int64_t* step_out) {
  const std::string where = logical_.short_name();
  check_optimizer_arguments(where.c_str(), dtype, u, num_segments, step_in, step_out);
  cuda_kernels::OptimizerSegments s{};
  for (int j = 0; j < num_segments; ++j) {
    const UpdateSegment& g = segments[j];
    // Never refused: check_optimizer_arguments bounded num_segments by kMaxUpdateSegments.
    MIRRORED_ENFORCE(cuda_kernels::add_segment(s, g.param, g.grad, g.slot, g.count), InternalError,
                     "apply_optimizer on ", where, ": segment ", j, " does not fit one launch");
  }
  CudaDeviceGuard guard(physical_, logical_);
  check(cuda_kernels::apply_optimizer(dtype, u, s, step_in, step_out, lane_for_call().stream),
        "apply_optimizer kernel launch");
}

}  // namespace mirrored::detail
