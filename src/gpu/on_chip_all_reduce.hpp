#pragma once
// Private: ReductionToOneDevice's all-reduce for logical GPUs that share one physical GPU, written
// over the GPU backends' streams and events, so that every GPU platform (CUDA, the simulated GPU)
// runs the same code; see on_chip_all_reduce.cpp.

#include "gpu/gpu_runtime.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// `GpuRuntime::all_reduce_on_chip` for the backends of `runtime`.
bool on_chip_all_reduce(GpuRuntime& runtime, ReduceOp op, CollectiveStep& step);

}  // namespace mirrored::detail
