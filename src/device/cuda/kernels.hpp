#pragma once
// Private: launchers of the CUDA backend's kernels (src/device/cuda/kernels.cu). Every launcher enqueues
// on `stream` (whose device must be current) and returns the launch's error; it never throws.
// No Eigen and no other mirrored header with templates heavier than dtype.hpp reach nvcc.

#include <cuda_runtime.h>

#include <cstdint>

#include "device/cuda/kernel_index.hpp"
#include "mirrored/dtype.hpp"

namespace mirrored::detail::cuda_kernels {

/// Replicas the fused same-chip all-reduce takes.
inline constexpr int kMaxFusedReplicas = 16;

/// Element-wise ops; the same order as detail::BinaryOp.
enum class Binary : int { add = 0, sub = 1, mul = 2, div = 3 };

/// `dst[i] = value` (`value`: a host pointer to one element of `dtype`).
cudaError_t fill(DType dtype, void* dst, int64_t n, const void* value, cudaStream_t stream);

/// `out[i] = a[i or 0] op b[i or 0]`. Integer division by zero stores 0 and lowers
/// `*div_by_zero_index` (device memory, initialised to UINT64_MAX) to the smallest such index.
cudaError_t binary(Binary op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
                   int64_t n, unsigned long long* div_by_zero_index, cudaStream_t stream);

/// `out[i] = ((start[i] + in[0][i]) + in[1][i]) + …` where `start` is `acc` when given, else
/// `in[0]` (then the sum runs over in[1..k-1]). `k` <= kMaxSumInputs (kernel_index.hpp: more are
/// chained, sum_chain_link). `out` may alias any input. `mean_divisor` > 0: the sum is divided by
/// it before it is rounded to the element type (MEAN).
cudaError_t sum_n(DType dtype, const void* const* in, int k, const void* acc, void* out, int64_t n, cudaStream_t stream,
                  int64_t mean_divisor = 0);

/// Sums `[outer, length, inner]` along the middle axis into `[outer, inner]`, in index order.
cudaError_t sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out,
                     cudaStream_t stream);

/// `inout[i] /= divisor` (integers truncate; the caller rejects a zero integer divisor).
cudaError_t divide(DType dtype, void* inout, int64_t n, int64_t divisor, cudaStream_t stream);

/// `dst[i] = static_cast<D>(src[i])`.
cudaError_t cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, cudaStream_t stream);

/// The same-chip all-reduce: `s = ((in[0][i] + in[1][i]) + …)`, divided by `mean_divisor` when
/// it is > 0, written to every `out[r][i]`. `k` <= kMaxFusedReplicas.
cudaError_t all_reduce_fused(DType dtype, const void* const* in, void* const* out, int k, int64_t n,
                             int64_t mean_divisor, cudaStream_t stream);

/// One kernel: the fused optimizer update of every segment (float32 or float64; OptimizerSegments
/// is in kernel_index.hpp), at step `*step_in + 1` read on the device; block 0 writes that step to
/// `*step_out` when not null.
cudaError_t apply_optimizer(DType dtype, const OptimizerUpdate& u, const OptimizerSegments& segments,
                            const int64_t* step_in, int64_t* step_out, cudaStream_t stream);

}  // namespace mirrored::detail::cuda_kernels
