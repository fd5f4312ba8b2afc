#pragma once
// Adam's bias-corrected step size, written once for every update that uses it: the Adam and AdamW
// templates of <mirrored/optimizers.hpp> (their per-tensor `update`), the host backend's fused
// update (which the simulated GPU runs too) and the CUDA kernel, which nvcc compiles from this
// same function. All of them compute this double and only then round it to the tensor's type, so
// the per-tensor and fused paths agree to the bit.

#include <cmath>

// nvcc compiles the function for the device too; every other compiler sees a plain inline one.
#if defined(__CUDACC__)
#define MIRRORED_HOST_DEVICE __host__ __device__
#else
#define MIRRORED_HOST_DEVICE
#endif

namespace mirrored::detail {

/// `learning_rate · sqrt(1 − beta_2^step) / (1 − beta_1^step)` at (1-based) `step`.
MIRRORED_HOST_DEVICE inline double adam_step_size(double learning_rate, double beta_1, double beta_2, double step) {
  return learning_rate * std::sqrt(1 - std::pow(beta_2, step)) / (1 - std::pow(beta_1, step));
}

}  // namespace mirrored::detail
