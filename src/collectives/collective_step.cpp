// The out-of-line part of the public CollectiveStep (everything that touches the rendezvous), and
// the cross-worker stage's interface, which the steps of a multi-worker strategy pass through.
#include "mirrored/collective_step.hpp"

#include "collectives/collective_group.hpp"
#include "collectives/packing.hpp"
#include "collectives/worker_stage.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

int CollectiveStep::num_replicas() const noexcept { return group_ ? group_->size() : 1; }

void CollectiveStep::sync() {
  if (group_) group_->sync(replica_, deadline_);
}

bool CollectiveStep::aborted() const noexcept { return group_ != nullptr && group_->aborted(); }

const std::vector<int64_t>& CollectiveStep::split() const {
  const CollectiveRequest& mine = request(replica_);
  MIRRORED_ENFORCE(mine.split != nullptr, InternalError,
                   "CollectiveStep::split: this collective is not a reduce-scatter");
  return *mine.split;
}

CollectiveStep::PackPlan CollectiveStep::plan_packs() const {
  // The one planner of the library, so a backend's packs end where the other paths' do.
  return detail::plan_packs(inputs(replica_), options().bytes_per_pack);
}

const CollectiveRequest& CollectiveStep::request(int r) const {
  // A group's payloads are the requests its replicas joined with (CollectivePlan posts nothing else).
  return group_ ? *static_cast<const CollectiveRequest*>(group_->payload(r)) : *solo_;
}

namespace detail {
WorkerStage::~WorkerStage() = default;
}  // namespace detail

}  // namespace mirrored
