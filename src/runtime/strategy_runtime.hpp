#pragma once
// Private: the threading state of one strategy, behind Strategy's pointer so that user code does not
// compile the mutexes and condition variables.
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

#include "collectives/collective_group.hpp"
#include "collectives/collective_plan.hpp"
#include "runtime/async_collectives.hpp"
#include "runtime/replica_pool.hpp"

namespace mirrored::detail {

struct StrategyRuntime {
  StrategyRuntime(int num_replicas, std::shared_ptr<CrossDeviceOps> ops, double collective_timeout_s,
                  double stall_warn_s)
      : collective_timeout_s(collective_timeout_s),
        group(num_replicas, stall_warn_s),
        plan(group, std::move(ops)),
        async(num_replicas) {}

  // Written by set_collective_timeout_seconds while replica threads may read it.
  std::atomic<double> collective_timeout_s;
  CollectiveGroup group;
  CollectivePlan plan;                // every collective goes through it; multi-worker strategies set its stage
  AsyncCollectives async;             // after `group`: its threads (which use the group) stop first
  std::unique_ptr<ReplicaPool> pool;  // none for the default strategy, which runs inline
  // From here on: what the caller writes on every run. A cache line of its own, so that the replica
  // threads reading the members above (`pool`, `async`, `group`) do not pull the line from the
  // caller's core at each run and make the caller take it back (a timeline that read `pool` on every
  // replica's run added 15 % to an empty 1-replica run through this alone).
  alignas(64) std::mutex run_mu;  // one run at a time
  std::int64_t runs = 0;          // runs started, under run_mu (the timeline's step numbers)
  std::mutex failure_mu;
  std::exception_ptr first_failure;
  bool first_failure_aborted = false;  // first_failure is an AbortedError
};

}  // namespace mirrored::detail
