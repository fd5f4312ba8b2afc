#pragma once
// Private: where a device lives and how two devices relate, for the layers above the device layer.
// They ask here rather than a backend: the answers depend on the logical-GPU table of every GPU
// platform (CUDA, simulated), never on which platform serves the process.

#include "mirrored/device.hpp"

namespace mirrored::detail {

/// The physical GPU (chip) that GPU `gpu` lives on: logical GPUs split from one physical GPU by
/// `config::set_logical_gpu_devices` share it. Asks the GPU runtime (made on first use).
/// \throws NotFoundError when logical GPU `gpu.index()` does not exist.
int physical_gpu_of(const Device& gpu);

/// True when one backend serves both devices: two host devices (every `CPU:k` is the host), or
/// two names of the same logical GPU. Memory of one is then memory of the other, ordered on the
/// same stream. Never asks the GPU runtime.
bool same_backend(const Device& a, const Device& b);

/// True when kernels of either device can address the other's memory directly: `same_backend`,
/// or two logical GPUs on one physical GPU (whose work is ordered on different streams).
bool same_memory(const Device& a, const Device& b);

}  // namespace mirrored::detail
