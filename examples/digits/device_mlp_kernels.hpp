#pragma once
// The example's own CUDA kernels for the digits MLP (device_mlp_kernels.cu): plain pointers and a
// stream, so that nvcc sees neither Eigen nor mirrored's templates. Each returns the launch's
// error.
#include <cuda_runtime.h>

#include <cstdint>

namespace digits::kernels {

/// `z[b][j] += bias[j]; h[b][j] = max(z[b][j], 0)` over a `(rows, cols)` row-major `z`.
cudaError_t bias_relu(float* z, const float* bias, float* h, int64_t rows, int64_t cols, cudaStream_t stream);
/// `z[b][j] += bias[j]`.
cudaError_t bias_add(float* z, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
/// Per row of `logits` `(rows, classes)`: `loss[b] = logsumexp - logits[b][y[b]]` and `d[b] =
/// softmax(logits[b]) - onehot(y[b])` (NaN for a label outside 0..classes-1); then `*loss_sum = sum
/// of loss` (one thread, in row order).
cudaError_t softmax_xent(const float* logits, const int32_t* y, int64_t rows, int64_t classes, float* loss, float* d,
                         float* loss_sum, cudaStream_t stream);
/// `dh[i] = z[i] > 0 ? dh[i] : 0`.
cudaError_t relu_backward(float* dh, const float* z, int64_t n, cudaStream_t stream);
/// `out[j] = sum over b of m[b][j]` (in row order).
cudaError_t column_sum(const float* m, int64_t rows, int64_t cols, float* out, cudaStream_t stream);

}  // namespace digits::kernels
