#pragma once
// Private: ReductionToOneDevice's all-reduce for logical GPUs that share one physical GPU, written
// over the GPU backends' streams and events (device/on_chip_gpu.hpp), so that every GPU platform
// (CUDA, the simulated GPU) runs the same code; see on_chip_all_reduce.cpp.

#include "mirrored/collective_step.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// `ReductionToOneDevice::all_reduce` when every GPU buffer of the step lives on one physical GPU
/// of the process's GPU platform: one kernel reads every replica's input and writes every replica's output.
/// Returns false (having done nothing) when the step does not qualify (no GPU buffer, several
/// chips, one replica); every replica decides alike.
bool on_chip_all_reduce(ReduceOp op, CollectiveStep& step);

}  // namespace mirrored::detail
