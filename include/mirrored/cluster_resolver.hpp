#pragma once
/// \file
/// Cluster resolvers: which tasks make up a multi-worker job and which one this process is
/// (TF's `tf.distribute.cluster_resolver`). `TFConfigClusterResolver` reads the `TF_CONFIG`
/// environment variable, `SimpleClusterResolver` takes the description directly, and
/// `SlurmClusterResolver` derives it from a Slurm job step's `SLURM_*` variables.

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mirrored {

/// Job name → task addresses (`"host:port"`), in task-index order (TF's `ClusterSpec`).
struct ClusterSpec {
  std::map<std::string, std::vector<std::string>> jobs;

  /// The addresses of `job`'s tasks. \throws InvalidArgumentError for a job not in the spec.
  std::vector<std::string> job_tasks(const std::string& job) const;
  /// Number of tasks of `job` (0 for a job not in the spec).
  int num_tasks(const std::string& job) const;
  /// The address of task `index` of `job`. \throws InvalidArgumentError for a job not in the
  /// spec or an index out of range.
  std::string task_address(const std::string& job, int index) const;
  /// True when the spec names no job.
  bool empty() const noexcept { return jobs.empty(); }
  friend bool operator==(const ClusterSpec&, const ClusterSpec&) = default;
};

/// What every resolver answers: the cluster, and this task's type and index in it.
class ClusterResolver {
 public:
  virtual ~ClusterResolver();
  /// The cluster (empty: a single local worker).
  virtual ClusterSpec cluster_spec() const = 0;
  /// This task's job ("chief", "worker", "evaluator", "ps"; empty when not set).
  virtual std::string task_type() const = 0;
  /// This task's index within its job.
  virtual int task_id() const = 0;
  /// The RPC layer named by the configuration (informational: collectives use Gloo/NCCL).
  virtual std::string rpc_layer() const;
};

namespace detail {
/// What the resolvers below share: each settles the cluster, this task and the RPC layer when
/// constructed, and answers from them.
class SettledClusterResolver : public ClusterResolver {
 public:
  ClusterSpec cluster_spec() const override { return cluster_; }
  std::string task_type() const override { return task_type_; }
  int task_id() const override { return task_id_; }
  std::string rpc_layer() const override { return rpc_layer_; }

 protected:
  SettledClusterResolver() = default;
  SettledClusterResolver(ClusterSpec cluster, std::string task_type, int task_id, std::string rpc_layer)
      : cluster_(std::move(cluster)),
        task_type_(std::move(task_type)),
        task_id_(task_id),
        rpc_layer_(std::move(rpc_layer)) {}

  ClusterSpec cluster_;
  std::string task_type_;
  int task_id_ = 0;
  std::string rpc_layer_;
};
}  // namespace detail

/// Reads `TF_CONFIG` (JSON `{"cluster": {job: ["host:port", …]}, "task": {"type": …, "index": …},
/// "rpc_layer": …}`) when constructed; the arguments, when given, override its task and RPC
/// layer. Unset or empty `TF_CONFIG`: an empty cluster (one local worker).
class TFConfigClusterResolver : public detail::SettledClusterResolver {
 public:
  /// Unknown top-level keys (such as TF's "environment") are ignored, as TF does; the rules of a
  /// multi-worker cluster (job names, one chief, index in range) are checked by
  /// `MultiWorkerMirroredStrategy`, so that they apply to every resolver.
  /// \throws InvalidArgumentError when `TF_CONFIG` is not valid JSON (a duplicate key included) or
  /// a known key has the wrong form: `cluster` not an object of lists of "host:port" strings,
  /// `task` not an object, `task.type` not a string, `task.index` not a non-negative integer,
  /// `rpc_layer` not a string — the message names the key.
  explicit TFConfigClusterResolver(std::optional<std::string> task_type = {}, std::optional<int> task_id = {},
                                   std::optional<std::string> rpc_layer = {});
};

/// A resolver over a given cluster and task.
class SimpleClusterResolver : public detail::SettledClusterResolver {
 public:
  SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id, std::string rpc_layer = "");
};

/// A resolver for a Slurm job step (TF's `SlurmClusterResolver`): the step's tasks
/// (`SLURM_STEP_NUM_TASKS`, or `SLURM_NTASKS`) on its nodes (`SLURM_STEP_NODELIST`, or
/// `SLURM_JOB_NODELIST`, in Slurm's compressed form such as `node[01-03,7]`), placed per
/// `SLURM_STEP_TASKS_PER_NODE` (such as `2(x3),1`), are assigned in rank order to `jobs` (job
/// name → number of tasks; default: every task a "worker"); this process is task
/// `SLURM_PROCID`. Task k on a node listens on `port_base + k`.
class SlurmClusterResolver : public detail::SettledClusterResolver {
 public:
  /// \throws InvalidArgumentError when a needed variable is missing or malformed (naming it), or
  /// when `jobs` does not account for exactly the step's tasks.
  explicit SlurmClusterResolver(std::map<std::string, int> jobs = {}, int port_base = 8888,
                                std::string rpc_layer = "grpc");
};

namespace detail {
/// Slurm's compressed host list (`a[1-3,07],b`) expanded in order. \throws InvalidArgumentError
/// naming `variable` when malformed.
std::vector<std::string> expand_slurm_hostlist(const std::string& list, const char* variable);
/// Slurm's tasks-per-node list (`2(x3),1`) expanded to one count per node. \throws
/// InvalidArgumentError naming `variable` when malformed.
std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const char* variable);
}  // namespace detail

}  // namespace mirrored
