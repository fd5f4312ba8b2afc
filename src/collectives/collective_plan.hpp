#pragma once
// Private: the one way every collective goes through the library. The runtime makes the call's
// Deadline where the call enters and calls the plan once per collective; the plan runs its
// stages, the same for every kind and for one worker or several:
//
//   agree        the local replicas join (CollectiveGroup) and check that they passed the same
//                (kind, op, axis, dtype, shape, structure, pack size) before any byte moves; the
//                stage checks the same across workers
//   pack         one planner (packing.hpp) for every path
//   local reduce the CrossDeviceOps of this process's replicas
//   cross-worker the WorkerStage: the cluster's for a MultiWorkerMirroredStrategy, LocalStage (no
//                other worker) for a MirroredStrategy
//   local copy   every local replica's outputs (or destinations) get the result
//
// Synchronous and asynchronous replica calls take the same path (an asynchronous one from its
// replica's lane thread). A failure of a cross-replica call that only this worker raised fails
// the whole job through the stage, so the other workers do not wait for it.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "collectives/collective_group.hpp"
#include "collectives/collective_helpers.hpp"
#include "collectives/worker_stage.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/optimizer_step.hpp"
#include "util/exceptions.hpp"

namespace mirrored::detail {

/// The wait of a collective for every replica to join it (the timeline's "rendezvous").
void join_traced(CollectiveGroup& group, int replica, CollectiveKind kind, const void* payload,
                 const Deadline& deadline);

/// Runs the part of a collective after a successful join. Other replicas may be reading this
/// replica's posted buffers until they leave too, so an error here aborts the group and waits for
/// them before it propagates (and the buffers go away).
template <class Body>
void inside_collective(CollectiveGroup& group, int replica, Body body) {
  try {
    body();
  } catch (...) {
    group.leave_failed(replica, describe_exception(std::current_exception()));
    throw;
  }
  group.leave(replica);
}

/// A replica's copies in `step` updated from `grads` (reduced, or its own), pack by pack on each
/// copy's device, and the step counter advanced: the update without any collective.
void update_copies(const OptimizerStep& step, const std::vector<UntypedTensor>& grads);

class CollectivePlan {
 public:
  /// `group`: this process's replicas; `local`: their CrossDeviceOps. Single-worker (LocalStage)
  /// until `set_stage`.
  CollectivePlan(CollectiveGroup& group, std::shared_ptr<CrossDeviceOps> local);

  /// The cross-worker stage of a multi-worker strategy (before any collective).
  void set_stage(std::shared_ptr<WorkerStage> stage);

  /// Idle threads for large cross-replica reductions and gathers (the runtime's replica pool);
  /// without it everything runs on the calling thread.
  void set_parallel(Parallel parallel) { parallel_ = std::move(parallel); }

  /// An asynchronous all-reduce may write its outputs over its inputs.
  bool reduces_in_place() const noexcept { return stage_->reduces_in_place(*local_); }
  /// One replica and no other worker: a collective has nobody to wait for.
  bool alone() const noexcept { return group_.size() == 1 && stage_->num_workers() == 1; }

  // ----- Replica context: called by every local replica (its thread, or its lane's).

  /// All-reduce of `request` (the calling replica's: inputs, outputs, structure, op, options),
  /// which is what the replica posts. Its kind is all_reduce or all_reduce_async (the call
  /// sequence check tells them apart). `flight_seq`: the flight recorder's entry of an
  /// asynchronous call, made when it was issued (0: the call makes its own).
  void all_reduce(int replica, const CollectiveRequest& request, const Deadline& deadline, uint64_t flight_seq = 0);

  /// Reduce-scatter of `request.inputs[0]`: the calling replica's output gets its piece
  /// (`request.split`, every replica of every worker in global order). Its kind is reduce_scatter
  /// or reduce_scatter_async.
  void reduce_scatter(int replica, const CollectiveRequest& request, const Deadline& deadline, uint64_t flight_seq = 0);

  /// An optimizer step of the calling replica (`Optimizer::apply_gradients` inside `run`, see
  /// optimizer_step.cpp): the gradients reduced (or not) and every copy updated, in one collective.
  void apply_gradients(int replica, OptimizerStep& mine, const Deadline& deadline);

  /// All-gather along `request.axis` of `request.inputs[0]`; returns the calling replica's output.
  /// The plan posts the request with outputs of its own (`request.outputs` is not read).
  std::vector<UntypedTensor> all_gather(int replica, const CollectiveRequest& request, const Deadline& deadline);

  /// merge_call's rendezvous (of this worker's replicas: merge_fn runs per worker, and what it
  /// calls on the strategy spans the workers): replica 0 calls `on_first` with every replica's
  /// `payload`, then every replica calls `take` with replica 0's. `signature` is the type
  /// `payload` points to; replicas whose types differ are rejected before anyone reads another's
  /// payload.
  void merge_call(int replica, const void* payload, const std::type_info& signature,
                  const std::function<void(const std::vector<const void*>&)>& on_first,
                  const std::function<void(const void*)>& take, const Deadline& deadline);

  /// detail::agree_on_variables: every local replica's `ids` and `names` against replica 0's,
  /// then (replica 0 for its worker) the names across workers. Every replica throws the same
  /// error.
  void agree_on_variables(int replica, const char* op, const std::vector<const void*>& ids,
                          const std::vector<std::string>& names, const Deadline& deadline);

  // ----- Cross-replica context: the caller's thread.

  /// `Strategy::reduce`: `leaves[r]` is replica r's flattened value (`structures[r]` its nest).
  /// `distributed` is false for a value that is not per replica (every worker's own: reduced
  /// locally, not across workers). Results are on the host.
  std::vector<UntypedTensor> reduce(ReduceOp op, const std::vector<std::vector<UntypedTensor>>& leaves,
                                    const std::vector<std::string>& structures, std::optional<int> axis,
                                    bool distributed, const Deadline& deadline);

  /// `StrategyExtended::batch_reduce_to`: reduces `values[i]` (one tensor per local replica on
  /// `devices`) and places the result on every device of `destinations[i]`, packed by
  /// `options.bytes_per_pack` (the caller's options; a cross-replica reduction is never compressed).
  std::vector<std::vector<UntypedTensor>> batch_reduce(const char* method, ReduceOp op,
                                                       const std::vector<std::vector<UntypedTensor>>& values,
                                                       const std::vector<std::vector<Device>>& destinations,
                                                       const std::vector<Device>& devices,
                                                       const CommunicationOptions& options, const Deadline& deadline);

  /// `Strategy::gather`: the concatenation along `axis` of every replica's part, on the host.
  UntypedTensor gather(const std::vector<UntypedTensor>& parts, int axis, const Deadline& deadline);

  /// A variable's initial value: replaced by the chief's.
  void broadcast(UntypedTensor& value, const Deadline& deadline);

  /// How many workers pass `mine` = true (WorkerStage::count_workers; `what` names the call).
  int count_workers(const char* what, bool mine, const Deadline& deadline) {
    return stage_->count_workers(what, mine, deadline);
  }

  /// `error` ended a run of this worker (see WorkerStage::local_failure).
  void local_failure(const std::exception_ptr& error) noexcept { stage_->local_failure(error); }

 private:
  // The stages of a cross-replica reduction after the checks: each of `packs` (indices into
  // `values`) reduced locally into `home`, then summed across workers by `stage`, then divided
  // for a MEAN (by `counts[p]` for pack p, summed across workers, when given; else by every
  // replica of every worker).
  std::vector<UntypedTensor> reduce_packed(WorkerStage& stage, ReduceOp op,
                                           const std::vector<std::vector<UntypedTensor>>& values,
                                           const std::vector<std::vector<std::size_t>>& packs, const Device& home,
                                           std::vector<int64_t> counts, const Deadline& deadline);
  template <class F>
  auto failing_job_on_error(F body) -> decltype(body());
  template <class Run>
  void reduction(const char* what, int replica, const CollectiveRequest& mine, const Deadline& deadline,
                 uint64_t flight_seq, Run run);
  // The local replicas' `parts` reduced into `out` by the local ops: split over idle threads when
  // large (CrossDeviceOps::reduce_part), else on the calling thread.
  void reduce_locally(ReduceOp op, const std::vector<UntypedTensor>& parts, const UntypedTensor& out);
  // A sharded optimizer step after the agreement: reduce-scatter, update of this replica's
  // slices, all-gather, pack by pack.
  void apply_sharded(int replica, OptimizerStep& mine, const Deadline& deadline);

  CollectiveGroup& group_;
  std::shared_ptr<CrossDeviceOps> local_;
  std::shared_ptr<WorkerStage> stage_;
  Parallel parallel_;
};

}  // namespace mirrored::detail
