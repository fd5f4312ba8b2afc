// The out-of-line part of the public CollectiveStep (everything that touches the rendezvous), and
// the cross-worker stage's interface, which the steps of a multi-worker strategy pass through.
#include "mirrored/collective_step.hpp"

#include "collectives/collective_group.hpp"
#include "collectives/worker_stage.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

int CollectiveStep::num_replicas() const noexcept { return group_ ? group_->size() : 1; }

void CollectiveStep::sync() {
  if (group_) group_->sync(replica_, deadline_);
}

bool CollectiveStep::aborted() const noexcept { return group_ != nullptr && group_->aborted(); }

const std::vector<int64_t>& CollectiveStep::split() const {
  const Buffers& mine = posted(replica_);
  MIRRORED_ENFORCE(mine.split != nullptr, InternalError, "CollectiveStep::split: this collective is not a reduce-scatter");
  return *mine.split;
}

const CollectiveStep::Buffers& CollectiveStep::posted(int r) const {
  return group_ ? *static_cast<const Buffers*>(group_->payload(r)) : *solo_;
}

namespace detail {
WorkerStage::~WorkerStage() = default;
}  // namespace detail

}  // namespace mirrored
