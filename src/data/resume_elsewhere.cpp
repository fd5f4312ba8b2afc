// Resuming a distributed iterator on another placement (other worker or replica counts): reading
// every saved worker's state, checking that they are one pass at one step, and which sharding
// lets a worker's position follow from the global one.
#include <string>
#include <vector>

#include "mirrored/detail/format.hpp"
#include "mirrored/distributed_dataset.hpp"

namespace mirrored::data::detail {

namespace core = ::mirrored::detail;

std::string describe_placement(const IteratorPlacement& p) {
  return core::str_cat(p.num_workers, p.num_workers == 1 ? " worker x " : " workers x ", p.local_replicas,
                       p.local_replicas == 1 ? " replica" : " replicas");
}

SavedIteratorState read_saved_state(const std::string& bytes, const std::string& op) {
  StateReader r(bytes, op);
  const uint64_t version = read_state_header(r, StateKind::distributed);
  SavedIteratorState s;
  s.placement.num_workers = r.i64();
  s.placement.worker_index = r.i64();
  s.placement.local_replicas = r.i64();
  s.placement.replicas_in_sync = r.i64();
  const IteratorPlacement& p = s.placement;
  r.check(p.num_workers >= 1 && p.worker_index >= 0 && p.worker_index < p.num_workers && p.local_replicas >= 1 &&
              p.replicas_in_sync == p.num_workers * p.local_replicas,
          "a placement of no workers and replicas");
  s.pipeline = r.str();
  s.counters.resize(static_cast<std::size_t>(r.count(-1, 8, "pass counters")));
  for (uint64_t& c : s.counters) c = r.u64();
  if (version >= kStateVersionWithSteps) s.steps_taken = r.u64();
  s.pass = r.str();
  r.expect_end();
  return s;
}

void check_saved_workers(const std::vector<SavedIteratorState>& saved, const std::string& op) {
  MIRRORED_ENFORCE(!saved.empty(), InvalidArgumentError, op, ": no saved worker state to restore from");
  const IteratorPlacement& first = saved[0].placement;
  MIRRORED_ENFORCE(static_cast<int64_t>(saved.size()) == first.num_workers, InvalidArgumentError, op, ": ",
                   saved.size(), " saved worker states for a pass saved by ", first.num_workers, " workers");
  for (std::size_t k = 0; k < saved.size(); ++k) {
    const IteratorPlacement& p = saved[k].placement;
    MIRRORED_ENFORCE(p.worker_index == static_cast<int64_t>(k), InvalidArgumentError, op, ": saved state ", k,
                     " is worker ", p.worker_index, "'s (every worker's state, in worker order, is needed)");
    MIRRORED_ENFORCE(p.num_workers == first.num_workers && p.local_replicas == first.local_replicas,
                     InvalidArgumentError, op, ": worker 0 saved on ", describe_placement(first), ", worker ", k,
                     " on ", describe_placement(p));
    MIRRORED_ENFORCE(saved[k].steps_taken == saved[0].steps_taken, InvalidArgumentError, op,
                     ": the workers saved at different steps of their pass: worker 0 after ",
                     saved[0].steps_taken.value_or(0), " steps, worker ", k, " after ",
                     saved[k].steps_taken.value_or(0),
                     " steps (save every worker's iterator at the same step, as CheckpointManager::save does)");
  }
}

std::string why_not_resumable_elsewhere(const ShardPlan& plan) {
  if (plan.keep_own_slices && !plan.ctx.shard_files && !plan.ctx.shard_hint) return {};
  if (plan.ctx.shard_files)
    return "the dataset is FILE-sharded: each worker's position is in its own files, which another number of "
           "workers deals out differently";
  if (plan.ctx.shard_hint)
    return "the dataset is HINT-sharded: each worker's position is in its own shard, which another number of "
           "workers cuts differently";
  return "the dataset's auto-shard policy is OFF: every worker reads all the data at a position of its own, "
         "which no position of another worker count determines";
}

}  // namespace mirrored::data::detail
