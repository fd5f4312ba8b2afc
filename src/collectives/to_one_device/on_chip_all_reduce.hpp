#pragma once
// Private: ReductionToOneDevice's all-reduce for logical GPUs that share one physical GPU, written
// over the GPU backends' streams and events, so that every GPU platform (CUDA, the simulated GPU)
// runs the same code; see on_chip_all_reduce.cpp.

#include "device/gpu/gpu_runtime.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// `ReductionToOneDevice::all_reduce` when every GPU buffer of the step lives on one physical GPU
/// of `runtime`: one kernel reads every replica's input and writes every replica's output.
/// Returns false (having done nothing) when the step does not qualify (no GPU buffer, several
/// chips, one replica); every replica decides alike.
bool on_chip_all_reduce(GpuRuntime& runtime, ReduceOp op, CollectiveStep& step);

}  // namespace mirrored::detail
