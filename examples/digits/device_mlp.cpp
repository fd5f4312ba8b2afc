// The digits MLP on a CUDA replica (device_mlp.hpp): cuBLAS products and the example's kernels
// (device_mlp_kernels.cu) on the replica's stream. cuBLAS is column-major: a row-major (r x c)
// matrix is its column-major transpose, so row-major C = A·B is computed as Cᵀ = Bᵀ·Aᵀ.
#include "digits/device_mlp.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <map>
#include <string>

#include <mirrored/cuda.hpp>
#include <mirrored/errors.hpp>

#include "digits/device_mlp_kernels.hpp"

namespace digits {
namespace {

using mirrored::Tensor;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw mirrored::InternalError(std::string("digits device MLP: ") + what + ": " + cudaGetErrorString(err));
}

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw mirrored::InternalError(std::string("digits device MLP: ") + what + " failed with cuBLAS status " +
                                  std::to_string(static_cast<int>(status)));
}

// One cuBLAS handle per replica thread and device, made on first use (inside run the replica's
// device is current) and set to the replica's stream on every use.
cublasHandle_t handle_for(const mirrored::Device& device, cudaStream_t stream) {
  struct Handles {
    std::map<int, cublasHandle_t> by_device;
    ~Handles() {
      for (auto& entry : by_device) (void)cublasDestroy(entry.second);
    }
  };
  thread_local Handles handles;
  auto it = handles.by_device.find(device.index());
  if (it == handles.by_device.end()) {
    cublasHandle_t h = nullptr;
    check_blas(cublasCreate(&h), "cublasCreate");
    it = handles.by_device.emplace(device.index(), h).first;
  }
  check_blas(cublasSetStream(it->second, stream), "cublasSetStream");
  return it->second;
}

void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasSgemm(h, ta, tb, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc), "cublasSgemm");
}

void check_on(const char* what, const mirrored::Device& device, const mirrored::Device& expected) {
  MIRRORED_ENFORCE(device == expected, mirrored::InvalidArgumentError, "digits device MLP: ", what, " is on ",
                   device.to_string(), ", the batch on ", expected.to_string());
}

}  // namespace

bool device_mlp_available(const mirrored::Device& device) noexcept {
  if (device.is_host()) return false;
  try {
    (void)mirrored::cuda::physical_device(device);  // refuses simulated GPUs
    return true;
  } catch (const mirrored::Error&) {
    return false;
  }
}

DeviceMlpStep device_mlp_loss_and_grads(const MlpParams& p, const Tensor<float>& x, const Tensor<int32_t>& y) {
  constexpr int I = static_cast<int>(kMlpInputs), H = static_cast<int>(kMlpHidden), O = static_cast<int>(kMlpOutputs);
  MIRRORED_ENFORCE(x.rank() == 2 && x.shape()[1] == kMlpInputs && y.rank() == 1 && y.shape()[0] == x.shape()[0],
                   mirrored::InvalidArgumentError, "digits device MLP: features of shape ", shape_string(x.shape()),
                   " and labels of shape ", shape_string(y.shape()), ", expected (batch, 64) and (batch,)");
  const mirrored::Device device = x.device();
  check_on("the labels", y.device(), device);
  const auto names = MlpParams::names();
  const auto params = p.tensors();
  for (std::size_t i = 0; i < params.size(); ++i) check_on(names[i].c_str(), params[i].device(), device);
  const int64_t rows = x.shape()[0];
  DeviceMlpStep out;
  if (rows == 0) {  // a replica without examples in a short last batch
    out.loss_sum = Tensor<float>::zeros({}, device);
    out.grads = {Tensor<float>::zeros({kMlpInputs, kMlpHidden}, device), Tensor<float>::zeros({kMlpHidden}, device),
                 Tensor<float>::zeros({kMlpHidden, kMlpOutputs}, device), Tensor<float>::zeros({kMlpOutputs}, device)};
    return out;
  }
  const int B = static_cast<int>(rows);
  const cudaStream_t stream = mirrored::cuda::current_stream();
  cublasHandle_t h = handle_for(device, stream);
  auto empty = [&](mirrored::Shape s) { return Tensor<float>::empty(std::move(s), device); };

  // Forward: z1 = x·w1 + b1, hidden = relu(z1), logits = hidden·w2 + b2.
  Tensor<float> z1 = empty({rows, kMlpHidden}), hidden = empty({rows, kMlpHidden});
  Tensor<float> logits = empty({rows, kMlpOutputs});
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, H, B, I, p.w1.data(), H, x.data(), I, z1.data(), H);
  check_cuda(kernels::bias_relu(z1.data(), p.b1.data(), hidden.data(), rows, kMlpHidden, stream), "bias_relu");
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, O, B, H, p.w2.data(), O, hidden.data(), H, logits.data(), O);
  check_cuda(kernels::bias_add(logits.data(), p.b2.data(), rows, kMlpOutputs, stream), "bias_add");

  // Loss and d(loss)/d(logits) = softmax - onehot.
  Tensor<float> loss = empty({rows}), dlogits = empty({rows, kMlpOutputs});
  out.loss_sum = empty({});
  check_cuda(kernels::softmax_xent(logits.data(), y.data(), rows, kMlpOutputs, loss.data(), dlogits.data(),
                                   out.loss_sum.data(), stream),
             "softmax_xent");

  // Backward: gw2 = hiddenᵀ·d, gb2 = Σ d, dz1 = (d·w2ᵀ) ⊙ (z1 > 0), gw1 = xᵀ·dz1, gb1 = Σ dz1.
  out.grads.w2 = empty({kMlpHidden, kMlpOutputs});
  out.grads.b2 = empty({kMlpOutputs});
  out.grads.w1 = empty({kMlpInputs, kMlpHidden});
  out.grads.b1 = empty({kMlpHidden});
  Tensor<float> dz1 = empty({rows, kMlpHidden});
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, O, H, B, dlogits.data(), O, hidden.data(), H, out.grads.w2.data(), O);
  check_cuda(kernels::column_sum(dlogits.data(), rows, kMlpOutputs, out.grads.b2.data(), stream), "column_sum");
  gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, H, B, O, p.w2.data(), O, dlogits.data(), O, dz1.data(), H);
  check_cuda(kernels::relu_backward(dz1.data(), z1.data(), rows * kMlpHidden, stream), "relu_backward");
  gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, H, I, B, dz1.data(), H, x.data(), I, out.grads.w1.data(), H);
  check_cuda(kernels::column_sum(dz1.data(), rows, kMlpHidden, out.grads.b1.data(), stream), "column_sum");
  return out;
}

}  // namespace digits
