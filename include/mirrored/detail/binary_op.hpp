#pragma once
/// \file
/// The element-wise binary operations of `Tensor<T>`'s operators, which the device backends
/// implement (`DeviceBackend::binary`, <mirrored/detail/device_backend.hpp>). Apart so that
/// <mirrored/tensor.hpp> names them without the backend interface.

namespace mirrored::detail {

/// Element-wise binary operations of the Tensor operators.
enum class BinaryOp { add, sub, mul, div };

}  // namespace mirrored::detail
