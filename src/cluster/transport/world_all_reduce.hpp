#pragma once
// Private: the GPU path between workers — one NCCL communicator over every GPU of every worker
// (rank = worker rank × local GPUs + local index), created with a unique id that the chief's
// replica 0 makes and hands out through the job's store. Implemented in
// src/cluster/transport/nccl/nccl_world.cpp; builds without NCCL compile no_nccl_world.cpp, which has none.

#include <memory>
#include <string>
#include <vector>

#include "cluster/store/store.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/device.hpp"

namespace mirrored::detail::cluster {

class WorldAllReduce {
 public:
  virtual ~WorldAllReduce();
  /// Called by every local replica thread: sets its outputs to the SUM of every replica's inputs
  /// of every worker, on its GPU, within `step.timeout_seconds()`. \throws DeadlineExceededError
  /// (the communicators are then aborted), UnavailableError for NCCL's system and remote errors,
  /// AbortedError once aborted.
  virtual void all_reduce_sum(CollectiveStep& step) = 0;
  /// True when every input and output of `step` lies on its replica's GPU (else the host path).
  virtual bool covers(const CollectiveStep& step) const = 0;
  /// Aborts the communicators (the job failed); later calls fail. Any thread, any time.
  virtual void abort() noexcept = 0;
};

/// Whether this worker can take part: the build has NCCL and `local` are distinct physical GPUs.
bool nccl_world_possible(const std::vector<Device>& local);

/// The NCCL communicator of every GPU of every worker. Collective across workers: every worker
/// calls it at start-up (after all of them found `nccl_world_possible`), with the same number of
/// local devices. \throws DeadlineExceededError when the chief's id or the communicators are not
/// ready within `timeout_s`; UnimplementedError in builds without NCCL.
std::unique_ptr<WorldAllReduce> make_nccl_world_all_reduce(const std::vector<Device>& local, int rank, int workers,
                                                           KeyValueStore& store, const std::string& prefix,
                                                           double timeout_s);

}  // namespace mirrored::detail::cluster
