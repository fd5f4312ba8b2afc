#pragma once
// The digits MLP's forward and backward pass on a GPU replica's device, for the device-resident
// training step: cuBLAS for the matrix products and a few kernels of this example (not the
// library's), enqueued on the replica's stream (mirrored::cuda::current_stream()), so nothing
// crosses to the host. The same math as mlp_loss_and_grads (mlp.hpp), up to float rounding in other
// orders. Built in CUDA builds (device_mlp.cpp, device_mlp_kernels.cu); elsewhere
// device_mlp_none.cpp says so.

#include <mirrored/tensor.hpp>

#include "mlp.hpp"

namespace digits {

/// True when `device` is a CUDA GPU of a build with the device-resident model (not a simulated GPU,
/// whose memory the example's kernels cannot touch).
bool device_mlp_available(const mirrored::Device& device) noexcept;

/// One replica's pass on its GPU: the sum of its per-example losses (a scalar on the device) and
/// the gradients of that sum, all device tensors on the batch's device.
struct DeviceMlpStep {
  mirrored::Tensor<float> loss_sum;
  MlpParams grads;
};

/// Inside `Strategy::run` on a CUDA GPU replica: `params`, `x` `(B, 64)` and `y` `(B,)` on the
/// replica's device. A label outside 0..9 makes that example's loss NaN (it is not read back to be
/// checked). \throws mirrored::InvalidArgumentError for wrong shapes or tensors on other devices;
/// mirrored::UnimplementedError in a build without CUDA; mirrored::InternalError when a cuBLAS call
/// or a launch fails.
DeviceMlpStep device_mlp_loss_and_grads(const MlpParams& params, const mirrored::Tensor<float>& x,
                                        const mirrored::Tensor<int32_t>& y);

}  // namespace digits
