#pragma once
/// \file
/// `MultiWorkerMirroredStrategy`: synchronous training on the replicas of several worker
/// processes (machines), configured like TF's by `TF_CONFIG` or a cluster resolver. See
/// docs/multi_worker.md.

#include <memory>
#include <string>
#include <vector>

#include "mirrored/cluster_resolver.hpp"
#include "mirrored/communication_options.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored {

namespace detail::cluster {
class MultiWorkerRuntime;  // the job membership and cross-worker collectives (src/cluster/)
struct MultiWorkerSetup;
}  // namespace detail::cluster

/// Every worker (process) of a cluster runs the same program with this strategy; the replicas of
/// all workers run each step in lockstep. Collectives are hierarchical: a worker's own replicas
/// reduce first (as in `MirroredStrategy`), the workers then combine their results — through
/// shared memory when all of them run on one host, else Gloo's ring over TCP — and each worker
/// hands the result back to its replicas. Workers meet through a small key/value store that the
/// chief serves on its port from the cluster spec.
///
/// `num_replicas_in_sync()` = workers × local replicas; replica ids are global (the chief's
/// replicas first). `run`, `experimental_local_results` and distributed values hold this
/// worker's replicas only; `reduce`, `gather`, `all_reduce`, `all_gather`, `batch_reduce_to`,
/// the optimizers' gradient all-reduce and variable creation (the chief's initial values are
/// broadcast) span every worker, so every worker must make the same calls in the same order.
/// `merge_call`'s `merge_fn` runs once per worker on its replicas' values (as in TF). Input
/// pipelines shard across workers (`num_input_pipelines` = workers, `input_pipeline_id` = rank).
class MultiWorkerMirroredStrategy : public Strategy {
 public:
  /// `communication_options.timeout_seconds` bounds every collective and the start-up (waiting
  /// for the other workers) instead of `MIRRORED_COLLECTIVE_TIMEOUT_S`; `implementation` RING
  /// forces Gloo over TCP between workers (AUTO: shared memory between workers of one host);
  /// NCCL needs GPU replicas. `cluster_resolver` defaults to a `TFConfigClusterResolver`; an
  /// empty cluster is a single local worker. `local_devices`: this worker's replicas (empty: its
  /// share of its machine's GPUs, else CPU:0 — with several workers on one machine, as the
  /// resolver's `local_placement()` says, worker r of n takes the r-th of n equal shares of the
  /// GPUs it sees; docs/multi_worker.md, "GPUs of a machine with several workers").
  /// \throws InvalidArgumentError for a cluster that breaks TF's rules (naming the key), a
  /// `ps` or `evaluator` task, bad devices, workers with different numbers of replicas, or, without
  /// `local_devices`, GPUs that cannot be shared out among the workers of the machine (more
  /// workers than GPUs, or a number that does not divide them) or two workers of one machine that
  /// took the same GPU (every worker alike, once joined);
  /// DeadlineExceededError when a worker does not join within the timeout (naming it);
  /// UnavailableError when the chief's port cannot be served.
  explicit MultiWorkerMirroredStrategy(CommunicationOptions communication_options = {},
                                       std::shared_ptr<ClusterResolver> cluster_resolver = nullptr,
                                       std::vector<std::string> local_devices = {});
  /// Waits (at most the collective timeout) until every other worker has finished too.
  ~MultiWorkerMirroredStrategy() override;

  std::string name() const override { return "MultiWorkerMirroredStrategy"; }
  /// The resolver the cluster came from.
  ClusterResolver& cluster_resolver() noexcept { return *resolver_; }

 private:
  MultiWorkerMirroredStrategy(detail::cluster::MultiWorkerSetup&& setup, const CommunicationOptions& o);

  std::shared_ptr<ClusterResolver> resolver_;
  std::shared_ptr<detail::cluster::MultiWorkerRuntime> runtime_;
};

}  // namespace mirrored
