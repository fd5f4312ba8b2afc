#pragma once
// Private: the cross-worker stage of the collective plan (collective_plan.hpp). Every strategy has
// one: a MultiWorkerMirroredStrategy the cluster's (src/cluster/coordinator/), whose replicas span
// several processes; a MirroredStrategy the `LocalStage` below, of one worker, which reduces
// through the local CrossDeviceOps alone. The plan calls it at the same points for both.
//
// Why not a CrossDeviceOps decorator: besides the arithmetic, the runtime must know other
// workers' shapes before it allocates outputs (all_gather, gather), other workers' element
// counts before it divides (reduce MEAN along an axis), and variables need the chief's initial
// values — none of which are CrossDeviceOps operations.
//
// Every call is collective across workers: all workers make the same calls in the same order.
// Calls are made from one thread at a time per strategy (the calling thread, or one replica
// thread of the local group), so an implementation may run them on a communication thread of its
// own (asynchronous collectives) as long as it keeps that order.

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

class CollectiveGroup;
class FlightRecorder;

class WorkerStage {
 public:
  virtual ~WorkerStage();

  /// The local replicas' flight recorder, whose state the stage reports (and exchanges with the
  /// other workers) when a cross-worker collective fails. Set once, before any collective; it
  /// outlives the stage's collectives.
  virtual void attach_recorder(FlightRecorder& /*recorder*/) {}

  virtual int num_workers() const noexcept = 0;
  /// This worker's rank: 0 is the chief.
  virtual int worker_index() const noexcept = 0;

  /// True when an asynchronous all-reduce may write its outputs over its inputs: `local` reads
  /// every byte before anyone writes one, and nothing reads the local inputs after the local
  /// reduction.
  virtual bool reduces_in_place(const CrossDeviceOps& local) const noexcept = 0;

  /// Replica context, called by every local replica thread inside a joined collective whose
  /// local inputs were validated (`group` is null when the worker has one replica): fills every
  /// local replica's outputs with the reduction of every replica of every worker — the local
  /// replicas through `local` first, then across workers, then back to the local replicas.
  virtual void all_reduce(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) = 0;

  /// Replica context `reduce_scatter` (called like `all_reduce`): fills the calling replica's
  /// `outputs[0]` with its piece (`step.split()`, over every replica of every worker in global
  /// order) of the reduction of every replica's `inputs[0]` of every worker.
  virtual void reduce_scatter(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) = 0;

  /// Replica context `all_gather` (called like `all_reduce`; the local replicas' dtypes and axes
  /// were checked): appends to `outs` the calling replica's output, the concatenation along
  /// `axis` of every replica's input of every worker in global replica order, after checking
  /// shapes across all of them.
  virtual void all_gather(int axis, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group,
                          std::vector<UntypedTensor>& outs) = 0;

  /// Cross-replica context: checks that every worker makes the same call, described by
  /// `signature()` (op, structure, dtypes, shapes; made only where there is someone to compare
  /// with). \throws InvalidArgumentError naming the first worker whose call differs from the
  /// chief's, showing both.
  virtual void agree(const std::string& op, const std::function<std::string()>& signature,
                     const Deadline& deadline) = 0;

  /// Cross-replica context: sums host tensors across workers in place (every worker passes the
  /// same dtypes and shapes, checked by `agree` before), and `counts` element-wise.
  virtual void sum(std::vector<UntypedTensor>& tensors, std::vector<int64_t>& counts, const Deadline& deadline) = 0;

  /// Cross-replica context: the concatenation along `axis` (negative counts from the end) of every
  /// worker's `local_parts` (one per local replica), in global replica order, on the host; the
  /// local concatenation may use `parallel`'s threads. \throws InvalidArgumentError (as
  /// `Strategy::gather`) naming global replica indices.
  virtual UntypedTensor gather(const std::vector<UntypedTensor>& local_parts, int axis, const Deadline& deadline,
                               const Parallel& parallel) = 0;

  /// Replaces `value` with the chief's (same dtype and shape on every worker, checked).
  virtual void broadcast(UntypedTensor& value, const Deadline& deadline) = 0;

  /// Cross-replica context: how many workers pass `mine` = true (the distributed iterators'
  /// end-of-input agreement; `what` names the call in the check that every worker makes it).
  virtual int count_workers(const char* what, bool mine, const Deadline& deadline) = 0;

  /// `error` ended a `run` or a cross-replica call of this worker. Unless every worker raised it
  /// together (different calls, dtypes or shapes across workers), the other workers now wait in
  /// collectives this worker will not make: the job fails, and they get AbortedError naming this
  /// worker at once instead of waiting for the timeout.
  virtual void local_failure(const std::exception_ptr& error) noexcept = 0;
};

/// The stage of a strategy of one worker: there is nobody to reach, so `all_reduce` and
/// `all_gather` are the local CrossDeviceOps', `agree`, `sum` and `broadcast` change nothing,
/// `count_workers` counts this worker alone, and `gather` concatenates the local parts.
class LocalStage final : public WorkerStage {
 public:
  int num_workers() const noexcept override { return 1; }
  int worker_index() const noexcept override { return 0; }
  bool reduces_in_place(const CrossDeviceOps& local) const noexcept override { return local.reduces_in_place(); }
  void all_reduce(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) override;
  void reduce_scatter(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) override;
  void all_gather(int axis, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group,
                  std::vector<UntypedTensor>& outs) override;
  void agree(const std::string&, const std::function<std::string()>&, const Deadline&) override {}
  void sum(std::vector<UntypedTensor>&, std::vector<int64_t>&, const Deadline&) override {}
  UntypedTensor gather(const std::vector<UntypedTensor>& local_parts, int axis, const Deadline& deadline,
                       const Parallel& parallel) override;
  void broadcast(UntypedTensor&, const Deadline&) override {}
  int count_workers(const char*, bool mine, const Deadline&) override { return mine ? 1 : 0; }
  void local_failure(const std::exception_ptr&) noexcept override {}
};

}  // namespace mirrored::detail
