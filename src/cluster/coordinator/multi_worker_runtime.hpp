#pragma once
// Private: the cross-worker stage of MultiWorkerMirroredStrategy (the runtime's WorkerStage):
// hierarchical collectives over the job's transport. In replica context, local replica 0 (the
// "leader") does the cross-worker part while the others wait: local reduction first (the
// strategy's CrossDeviceOps), then the workers' results are combined through the transport, then
// the local replicas copy the leader's result. Every cross-worker call starts by checking that
// all workers make the same call with the same dtypes, shapes and compression (a 16-byte exchange;
// the full descriptions only when they differ).

#include <memory>
#include <string>
#include <vector>

#include "cluster/coordinator/coordinator.hpp"
#include "cluster/transport/world_all_reduce.hpp"
#include "collectives/worker_stage.hpp"
#include "mirrored/communication_options.hpp"

namespace mirrored::detail::cluster {

class MultiWorkerRuntime : public WorkerStage {
 public:
  /// Joins the job (see Coordinator) with this worker's replicas on `local`. `implementation`:
  /// RING forces Gloo over TCP between workers (no shared memory, no NCCL); AUTO and NCCL use
  /// one NCCL communicator over every worker's GPUs when every worker's replicas are distinct
  /// physical GPUs and the build has NCCL, shared memory between workers of one host, else Gloo.
  /// `default_gpus`: the machine's names of the GPUs this worker took by default (none when its
  /// devices were given); the workers check that no two of one machine took the same
  /// (shared_gpus.hpp: InvalidArgumentError on every worker).
  MultiWorkerRuntime(const ClusterLayout& layout, double timeout_s, const std::vector<Device>& local,
                     CommunicationImplementation implementation, const std::vector<std::string>& default_gpus = {});
  ~MultiWorkerRuntime() override;

  int num_workers() const noexcept override { return num_workers_; }
  int worker_index() const noexcept override { return rank_; }
  /// Never: the cross-worker stage reads the local results after the local reduction.
  bool reduces_in_place(const CrossDeviceOps&) const noexcept override { return false; }

  void all_reduce(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) override;
  /// Hierarchical, as all_reduce: the leader sums the local replicas' inputs on the host, the
  /// workers all-reduce that sum, and every local replica copies its piece out of it (so the
  /// bytes between workers are an all-reduce's, not a reduce-scatter's).
  void reduce_scatter(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group) override;
  void all_gather(int axis, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* group,
                  std::vector<UntypedTensor>& outs) override;
  void agree(const std::string& op, const std::function<std::string()>& signature, const Deadline& deadline) override;
  void sum(std::vector<UntypedTensor>& tensors, std::vector<int64_t>& counts, const Deadline& deadline) override;
  UntypedTensor gather(const std::vector<UntypedTensor>& local_parts, int axis, const Deadline& deadline,
                       const Parallel& parallel) override;
  void broadcast(UntypedTensor& value, const Deadline& deadline) override;
  /// One 16-byte all-gather: the same-call check's exchange, carrying each worker's answer.
  int count_workers(const char* what, bool mine, const Deadline& deadline) override;
  void local_failure(const std::exception_ptr& error) noexcept override;
  /// Failures of cross-worker collectives report every worker's replicas (Coordinator::flight_report).
  void attach_recorder(FlightRecorder& recorder) override;

  /// Leaves the job (goodbye and shutdown barrier); later calls fail. Idempotent.
  void shutdown();

  /// Seconds a local replica waits for its leader beyond the collective's deadline: the leader's
  /// own cross-worker wait ends by the deadline (plus kCollectiveGraceSeconds to learn the cause),
  /// and its error (naming the worker at fault) aborts the local replicas at once and should be
  /// the one `run` reports; this wait is only the backstop should the leader hang.
  static constexpr double kLeaderGraceSeconds = 10.0;

 private:
  Coordinator& coordinator();
  // Inside a collective: every worker passes `op` and `signature`; throws when they differ.
  void check_same_call(const std::string& op, const std::string& signature, Coordinator::Clock::time_point deadline);
  // Every worker's shapes of `local` (one per local replica, equal ranks checked by the caller's
  // signature), in global replica order.
  std::vector<Shape> exchange_shapes(const std::vector<const Shape*>& local, std::size_t rank,
                                     Coordinator::Clock::time_point deadline);
  // The collective body of all_gather and gather: checks that every worker calls `op` with the
  // same axis, dtype and rank, exchanges every replica's shape (every worker raises the same
  // shape error, if any) and returns every worker's `local_parts` concatenated along `axis`, on
  // `home`.
  UntypedTensor concat_across_workers(const char* op, const std::vector<const UntypedTensor*>& local_parts, int axis,
                                      const Device& home, Coordinator::Clock::time_point deadline,
                                      const Parallel& parallel = {});
  // out = concatenation along `axis` of every worker's `local_concat` (global shapes `shapes`).
  void gather_across(const UntypedTensor& local_concat, const std::vector<Shape>& shapes, int local_replicas, int axis,
                     const UntypedTensor& out, Coordinator::Clock::time_point deadline);
  // Sums `srcs[i]` of every worker into `dsts[i]` (host or device), in packs of
  // `options.bytes_per_pack` per dtype run; float32 and float64 packs cross as
  // `options.compression` says (WorkerTransport::all_reduce_half), rounded to the half type and
  // widened back by their GPU's kernels when a pack lives on one GPU. `options` are the
  // collective's, as its request carries them.
  void sum_across(const std::vector<UntypedTensor>& srcs, const std::vector<UntypedTensor>& dsts,
                  const CommunicationOptions& options, Coordinator::Clock::time_point deadline);

  // The job's failure, if it failed (for errors of the GPU path, which runs outside the
  // coordinator's collectives).
  [[noreturn]] void rethrow_gpu_failure(const char* what);

  int num_workers_;
  int rank_;
  // The leader's whole reduction during a reduce_scatter, which the local replicas copy their
  // pieces from (one collective of the local group is in flight at a time).
  UntypedTensor scattered_;
  std::unique_ptr<WorldAllReduce> world_;  // destroyed after the coordinator, which may abort it
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace mirrored::detail::cluster
