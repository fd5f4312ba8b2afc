#pragma once
/// \file
/// Cluster resolvers: which tasks make up a multi-worker job and which one this process is
/// (TF's `tf.distribute.cluster_resolver`). `TFConfigClusterResolver` reads the `TF_CONFIG`
/// environment variable, `SimpleClusterResolver` takes the description directly,
/// `SlurmClusterResolver` derives it from a Slurm job step's `SLURM_*` variables, and (beyond TF)
/// `TorchrunClusterResolver` and `MPIClusterResolver` from the variables torchrun and MPI launchers
/// set; `cluster_resolver_from_environment()` picks the one for the launcher that started the
/// process (docs/multi_worker.md, "Launching on a cluster").

#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mirrored {

/// Job name → task addresses (`"host:port"`), in task-index order (TF's `ClusterSpec`).
///
/// Beyond TF, an address may be empty: a task whose address is not known in advance (launchers
/// such as torchrun and mpirun name only the rendezvous address, which is the chief's). Such a task
/// listens on its own address towards the chief (the one its route to the chief leaves from) and
/// the other workers learn it through the chief's store when it joins. The chief's address (the
/// `chief` task, else worker 0) is never empty: the chief serves the job's store there.
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

/// Beyond TF: where a worker (process) stands among the workers its launcher started on the same
/// machine, as the launcher says (torchrun's `LOCAL_RANK` and `LOCAL_WORLD_SIZE`, MPI's local rank
/// and size, Slurm's `SLURM_LOCALID` and tasks on the node). `MultiWorkerMirroredStrategy` divides
/// the machine's GPUs among its workers by it when no `local_devices` are given
/// (docs/multi_worker.md, "GPUs of a machine with several workers").
struct LocalPlacement {
  /// This worker's index among the workers of its machine, from 0.
  int local_rank = 0;
  /// The number of workers on its machine (1: alone, or the launcher does not say).
  int local_size = 1;
  /// The GPUs the launcher gave each worker of the machine as a view of its own (Slurm's
  /// `--gpus-per-task`, which binds each task to its GPUs); 0 when it does not say.
  int gpus_per_worker = 0;
  /// The variables it comes from, for messages ("torchrun's LOCAL_RANK=1, LOCAL_WORLD_SIZE=2");
  /// empty for the default.
  std::string source;
  friend bool operator==(const LocalPlacement&, const LocalPlacement&) = default;
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
  /// Beyond TF: where the cluster comes from, for messages and logs ("TF_CONFIG", "torchrun's
  /// variables (RANK=1, WORLD_SIZE=2, MASTER_ADDR=node0, MASTER_PORT=29500)"). Default: "the
  /// cluster resolver".
  virtual std::string source() const;
  /// Beyond TF: this worker's place among the workers of its machine. Default: `{0, 1}` (alone on
  /// its machine, as far as the resolver knows: `TFConfigClusterResolver` and
  /// `SimpleClusterResolver` keep it; TF_CONFIG says nothing of machines).
  virtual LocalPlacement local_placement() const;
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
  std::string source() const override { return source_.empty() ? ClusterResolver::source() : source_; }
  LocalPlacement local_placement() const override { return local_; }

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
  std::string source_;  // empty: the default
  LocalPlacement local_;
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
/// `SLURM_PROCID`. Task k on a node listens on `port_base + k`. Its `local_placement()`: task
/// `SLURM_LOCALID` of the tasks of its node, and `SLURM_GPUS_PER_TASK` GPUs per task when set.
class SlurmClusterResolver : public detail::SettledClusterResolver {
 public:
  /// \throws InvalidArgumentError when a needed variable is missing or malformed (naming it), when
  /// `jobs` does not account for exactly the step's tasks, or when `SLURM_LOCALID` is not this
  /// task's place in the blocks of tasks the cluster spec deals to the nodes (a step distributed
  /// other than `--distribution=block`, whose tasks would get the addresses of others).
  explicit SlurmClusterResolver(std::map<std::string, int> jobs = {}, int port_base = 8888,
                                std::string rpc_layer = "grpc");
};

namespace detail {
/// What the launchers' resolvers below share: a cluster of `size` "worker" tasks whose chief (rank
/// 0) serves the job's store on the rendezvous address (`MIRRORED_MASTER_ADDR`, else
/// `MASTER_ADDR`, and `MIRRORED_MASTER_PORT`, else `MASTER_PORT`) and whose other workers' addresses
/// are empty; this worker's rank, and its place among the workers of its machine
/// (`local_placement()`: the default `{0, 1}` unless the launcher names both the local rank and
/// the local size).
class LauncherClusterResolver : public SettledClusterResolver {
 protected:
  /// Reads the rank, the size, the local rank and the local size from the variables named (where a
  /// launcher names one several ways, those set must agree); `resolver` and `launcher` name them in
  /// messages and in `source()` ("torchrun's variables (RANK=1, …)"). The local ones are optional.
  /// \throws InvalidArgumentError as the resolvers below say.
  LauncherClusterResolver(const char* resolver, const char* launcher, std::initializer_list<const char*> rank,
                          std::initializer_list<const char*> size, std::initializer_list<const char*> local_rank,
                          std::initializer_list<const char*> local_size, std::string rpc_layer);

  int local_rank_ = 0;  // as the launcher says it (0 when unset)
  int local_size_ = 1;  // as the launcher says it (1 when unset)
};
}  // namespace detail

/// Beyond TF: a worker started by torchrun (`torch.distributed.run`), or by anything that sets
/// torch.distributed's `env://` variables (Kubeflow's PyTorchJob, `torch.distributed.launch`):
/// `WORLD_SIZE` workers, this one `RANK`, every one a "worker" task (rank 0 the chief). Rank 0
/// serves the job's store on `MASTER_ADDR:MASTER_PORT` (`MIRRORED_MASTER_ADDR` and
/// `MIRRORED_MASTER_PORT`, when set, take their place); the other workers' addresses are empty in
/// the cluster spec (each publishes its own when it joins). `LOCAL_RANK` and `LOCAL_WORLD_SIZE`
/// (this worker among those of its machine: `local_placement()`) and `TORCHELASTIC_RESTART_COUNT` (how often the agent
/// restarted the job) are read when set. `WORLD_SIZE` 1 is a single local worker (no address needed).
class TorchrunClusterResolver : public detail::LauncherClusterResolver {
 public:
  /// \throws InvalidArgumentError naming the variables when one is missing or not a number (a port
  /// outside 1..65535 included), when `RANK` >= `WORLD_SIZE`, `LOCAL_RANK` >= `LOCAL_WORLD_SIZE`
  /// or `LOCAL_WORLD_SIZE` > `WORLD_SIZE`, or when the rendezvous address is missing for a job of
  /// several workers.
  explicit TorchrunClusterResolver(std::string rpc_layer = "");
  /// This worker's index among the workers of its machine (`LOCAL_RANK`; 0 when unset).
  int local_rank() const noexcept { return local_rank_; }
  /// The number of workers on this machine (`LOCAL_WORLD_SIZE`; 1 when unset).
  int local_world_size() const noexcept { return local_size_; }
  /// How often the agent restarted the job (`TORCHELASTIC_RESTART_COUNT`; 0 when unset).
  int restart_count() const noexcept { return restart_count_; }

 private:
  int restart_count_ = 0;
};

/// Beyond TF: a worker started by an MPI launcher, one process per rank, every one a "worker" task
/// (rank 0 the chief): Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
/// `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`), PMIx launchers (`PMIX_RANK`, with
/// Open MPI's size), MPICH's and Intel MPI's Hydra (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
/// `MPI_LOCALNRANKS`; the local ones make `local_placement()`). Where several of these are set
/// they must agree. MPI launchers name no
/// address: rank 0 serves the job's store on `MIRRORED_MASTER_ADDR:MIRRORED_MASTER_PORT` (else
/// `MASTER_ADDR:MASTER_PORT`), passed on by the launcher (`mpirun -x MASTER_ADDR=node0 -x
/// MASTER_PORT=29500`); the other workers' addresses are empty in the cluster spec. No MPI is
/// linked: only the variables are read.
class MPIClusterResolver : public detail::LauncherClusterResolver {
 public:
  /// \throws InvalidArgumentError naming the variables when no rank or size is set, one is not a
  /// number, two disagree (`OMPI_COMM_WORLD_RANK` 1 but `PMIX_RANK` 0), the rank is not below the
  /// size, the local rank not below the local size, or the rendezvous address is missing (or its
  /// port outside 1..65535) for a job of several workers.
  explicit MPIClusterResolver(std::string rpc_layer = "");
  /// This process's index among the ranks of its machine (0 when the launcher does not say).
  int local_rank() const noexcept { return local_rank_; }
  /// The number of ranks on this machine (1 when the launcher does not say).
  int local_size() const noexcept { return local_size_; }
};

/// Beyond TF: the resolver for the launcher that started this process, looked for in this order
/// (the first that applies wins):
///  1. `TF_CONFIG` set and not blank (TF's own way; Kubeflow's TFJob sets it): `TFConfigClusterResolver`;
///  2. `RANK` or `WORLD_SIZE` set (torchrun, Kubeflow's PyTorchJob): `TorchrunClusterResolver`;
///  3. `OMPI_COMM_WORLD_RANK` set (Open MPI's `mpirun`): `MPIClusterResolver`;
///  4. `SLURM_STEP_ID` and `SLURM_PROCID` set (a task of an `srun` job step; an `sbatch` script
///     itself has no step id), unless `PMI_RANK` or `PMIX_RANK` differs from `SLURM_PROCID` (an MPI
///     launcher inside the step, such as MPICH's `mpiexec`, whose ranks are not the step's tasks):
///     `SlurmClusterResolver` with every task a worker, on port `MIRRORED_SLURM_PORT_BASE`
///     (default 8888, TF's) + the task's index on its node;
///  5. `PMI_RANK` or `PMIX_RANK` set (MPICH's and Intel MPI's Hydra, PMIx launchers): `MPIClusterResolver`;
///  6. otherwise `TFConfigClusterResolver` (no `TF_CONFIG`: a single local worker).
/// It logs its choice at INFO ("cluster_resolver_from_environment: torchrun's variables (RANK=1,
/// …)"). `MultiWorkerMirroredStrategy`'s default stays TF's `TFConfigClusterResolver`: pass this
/// one to find the cluster from whichever launcher started the program.
/// \throws InvalidArgumentError as the chosen resolver's constructor does (partial or inconsistent
/// variables, naming them), or for a malformed `MIRRORED_SLURM_PORT_BASE`.
std::shared_ptr<ClusterResolver> cluster_resolver_from_environment();

namespace detail {
/// Slurm's compressed host list (`a[1-3,07],b`) expanded in order. \throws InvalidArgumentError
/// naming `variable` when malformed.
std::vector<std::string> expand_slurm_hostlist(const std::string& list, const char* variable);
/// Slurm's tasks-per-node list (`2(x3),1`) expanded to one count per node. \throws
/// InvalidArgumentError naming `variable` when malformed.
std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const char* variable);
}  // namespace detail

}  // namespace mirrored
