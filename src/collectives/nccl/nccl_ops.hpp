#pragma once
// Private: what NcclAllReduce's operations share across its files (nccl_all_reduce.cpp: the
// collectives; nccl_optimizer_step.cpp: the fused sharded optimizer step): the communicators it
// holds, and the NCCL calls of a reduce-scatter and an all-gather of one flat buffer cut into
// uneven pieces.
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/nccl/nccl_comms.hpp"
#include "collectives/ops_selection.hpp"
#include "device/gpu_platform.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

namespace detail::nccl {

inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

/// Rank `me`'s NCCL calls of a reduce-scatter of `in` (the sum of every piece) into `out` (its
/// piece, `split[me]` elements): one ncclReduceScatter when every piece has the same size, else one
/// ncclReduce per non-empty piece onto its rank. Inside the caller's group; returns the first
/// failed call's result.
ncclResult_t enqueue_reduce_scatter(const void* in, void* out, const std::vector<int64_t>& split, int me, DType dtype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/// Rank `me`'s NCCL calls of an all-gather of every rank's piece (`split[r]` elements; rank me's
/// is `send`) into `recv`, the pieces one after the other: one ncclAllGather when every piece has
/// the same size, else one ncclBroadcast per non-empty piece from its rank. Inside the caller's
/// group; returns the first failed call's result.
ncclResult_t enqueue_all_gather(const void* send, void* recv, const std::vector<int64_t>& split, int me, DType dtype,
                                ncclComm_t comm, cudaStream_t stream);

}  // namespace detail::nccl

struct NcclAllReduce::Impl {
  static constexpr double kInitTimeoutS = 120;
  // MIRRORED_NCCL_SINGLE_RANK=1 (test only, read once when the ops are made): a single replica
  // goes through a one-rank communicator instead of a plain copy.
  const bool single_rank = [] {
    const char* v = std::getenv("MIRRORED_NCCL_SINGLE_RANK");
    return v && std::string(v) == "1";
  }();
  std::mutex mu;
  std::shared_ptr<detail::nccl::Comms> current;

  // The smallest number of replicas that goes through NCCL.
  int min_ranks() const noexcept { return single_rank ? 1 : 2; }

  // The communicators of these replica GPUs: the current ones, or new ones made by the first
  // replica to get here (the others find them ready).
  std::shared_ptr<detail::nccl::Comms> acquire(const std::vector<int>& logical, const std::vector<int>& physical,
                                               double timeout_s, bool run_aborted, const char* what) {
    // Simulated GPUs (MIRRORED_SIMULATED_GPUS) are not CUDA devices: NCCL cannot serve them.
    MIRRORED_ENFORCE(detail::nccl_can_run(), FailedPreconditionError, "NcclAllReduce::", what, ": NCCL cannot run on ",
                     detail::gpu_platform_name(), " GPUs (", detail::gpu_unavailable_reason(),
                     "); use ReductionToOneDevice, the default for them");
    std::lock_guard lock(mu);
    if (current && !current->aborted && current->logical == logical) return current;
    MIRRORED_ENFORCE(!run_aborted, AbortedError, "NcclAllReduce: the run was aborted because another replica failed");
    current.reset();  // aborts the previous set (it is idle: no collective of it is in flight)
    // Creating communicators (topology detection, connections) can take seconds on a large
    // machine, more than a short collective deadline allows; it gets at least kInitTimeoutS.
    current = detail::nccl::create_comms(logical, physical, std::max(timeout_s, kInitTimeoutS));
    return current;
  }
};

}  // namespace mirrored
