#pragma once
/// \file
/// The device questions of `<mirrored/dlpack.hpp>`, compiled into the library (which does not need
/// DLPack's header): DLPack names a GPU by its CUDA ordinal, the library by its logical index.
/// Needed by `Tensor<T>::from_dlpack` and `to_dlpack` (<mirrored/dlpack.hpp>).

#include <optional>

#include "mirrored/device.hpp"

namespace mirrored::detail {

/// The CUDA ordinal (physical GPU) behind logical GPU `gpu`. \throws InvalidArgumentError for a
/// host device; NotFoundError when this process does not have that GPU.
int dlpack_cuda_ordinal(const Device& gpu);
/// The first logical GPU on the GPU with CUDA ordinal `ordinal`; none when this process does not
/// have that GPU.
std::optional<Device> dlpack_gpu_of_ordinal(int ordinal);
/// Number of logical GPUs this process has (for messages).
int dlpack_gpu_count();

}  // namespace mirrored::detail
