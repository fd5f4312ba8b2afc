// device_mlp.hpp in a build without CUDA: the training step keeps its Eigen math on the host.
#include "digits/device_mlp.hpp"

#include <mirrored/errors.hpp>

namespace digits {

bool device_mlp_available(const mirrored::Device&) noexcept { return false; }

DeviceMlpStep device_mlp_loss_and_grads(const MlpParams&, const mirrored::Tensor<float>&,
                                        const mirrored::Tensor<int32_t>&) {
  throw mirrored::UnimplementedError("digits: the device-resident MLP needs a CUDA build of mirrored");
}

}  // namespace digits
