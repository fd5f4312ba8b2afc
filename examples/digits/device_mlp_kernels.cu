// The example's CUDA kernels for the digits MLP (device_mlp_kernels.hpp). Small, one thread per
// element or row: the model is 64-64-10 and a replica's batch a few dozen examples.
#include "digits/device_mlp_kernels.hpp"

#include <cmath>

namespace digits::kernels {
namespace {

constexpr int kThreads = 256;

unsigned blocks(int64_t n) { return static_cast<unsigned>(n < 1 ? 1 : (n + kThreads - 1) / kThreads); }

__global__ void bias_relu_kernel(float* z, const float* bias, float* h, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = z[i] + bias[i % cols];
  z[i] = v;
  h[i] = v > 0.0f ? v : 0.0f;
}

__global__ void bias_add_kernel(float* z, const float* bias, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) z[i] += bias[i % cols];
}

__global__ void softmax_xent_kernel(const float* logits, const int32_t* y, int64_t rows, int64_t classes, float* loss,
                                    float* d) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= rows) return;
  const float* l = logits + b * classes;
  float* g = d + b * classes;
  float max = l[0];
  for (int64_t c = 1; c < classes; ++c) max = fmaxf(max, l[c]);
  float sum = 0.0f;
  for (int64_t c = 0; c < classes; ++c) sum += expf(l[c] - max);
  const int32_t label = y[b];
  const bool ok = label >= 0 && label < classes;
  loss[b] = ok ? max + logf(sum) - l[label] : nanf("");
  for (int64_t c = 0; c < classes; ++c) g[c] = expf(l[c] - max) / sum - (c == label ? 1.0f : 0.0f);
}

__global__ void sum_kernel(const float* v, int64_t n, float* out) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += v[i];
  *out = s;
}

__global__ void relu_backward_kernel(float* dh, const float* z, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && !(z[i] > 0.0f)) dh[i] = 0.0f;
}

__global__ void column_sum_kernel(const float* m, int64_t rows, int64_t cols, float* out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int64_t b = 0; b < rows; ++b) s += m[b * cols + j];
  out[j] = s;
}

}  // namespace

cudaError_t bias_relu(float* z, const float* bias, float* h, int64_t rows, int64_t cols, cudaStream_t stream) {
  bias_relu_kernel<<<blocks(rows * cols), kThreads, 0, stream>>>(z, bias, h, rows, cols);
  return cudaGetLastError();
}

cudaError_t bias_add(float* z, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  bias_add_kernel<<<blocks(rows * cols), kThreads, 0, stream>>>(z, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t softmax_xent(const float* logits, const int32_t* y, int64_t rows, int64_t classes, float* loss, float* d,
                         float* loss_sum, cudaStream_t stream) {
  softmax_xent_kernel<<<blocks(rows), kThreads, 0, stream>>>(logits, y, rows, classes, loss, d);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  sum_kernel<<<1, 1, 0, stream>>>(loss, rows, loss_sum);
  return cudaGetLastError();
}

cudaError_t relu_backward(float* dh, const float* z, int64_t n, cudaStream_t stream) {
  relu_backward_kernel<<<blocks(n), kThreads, 0, stream>>>(dh, z, n);
  return cudaGetLastError();
}

cudaError_t column_sum(const float* m, int64_t rows, int64_t cols, float* out, cudaStream_t stream) {
  column_sum_kernel<<<blocks(cols), kThreads, 0, stream>>>(m, rows, cols, out);
  return cudaGetLastError();
}

}  // namespace digits::kernels
