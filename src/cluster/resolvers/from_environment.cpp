// cluster_resolver_from_environment: the resolver of whichever launcher started this process, in
// the order <mirrored/cluster_resolver.hpp> states.
#include <algorithm>

#include "cluster/resolvers/launcher_env.hpp"
#include "mirrored/cluster_resolver.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored {

namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// An MPI launcher inside a Slurm job step (MPICH's mpiexec starts its proxies with srun): its
// ranks are not the step's tasks. srun's own MPI plugins (--mpi=pmi2, pmix) give each task its
// SLURM_PROCID as PMI rank.
bool mpi_ranks_differ_from_slurm_tasks(const std::string& procid) {
  using detail::cluster::env_value;
  for (const char* v : {"PMI_RANK", "PMIX_RANK"})
    if (auto r = env_value(v); r && *r != procid) return true;
  return false;
}

int slurm_port_base() {
  const auto text = detail::cluster::env_value("MIRRORED_SLURM_PORT_BASE");
  if (!text) return 8888;
  const auto n = detail::cluster::env_number("cluster_resolver_from_environment", {"MIRRORED_SLURM_PORT_BASE"});
  MIRRORED_ENFORCE(*n.value >= 1 && *n.value <= 65535, InvalidArgumentError,
                   "cluster_resolver_from_environment: MIRRORED_SLURM_PORT_BASE='", *text,
                   "' is not a port (a whole number from 1 to 65535)");
  return *n.value;
}

}  // namespace

std::shared_ptr<ClusterResolver> cluster_resolver_from_environment() {
  using detail::cluster::env_value;
  std::shared_ptr<ClusterResolver> r;
  std::string why;
  const auto procid = env_value("SLURM_PROCID");
  if (const auto tf = env_value("TF_CONFIG"); tf && !blank(*tf)) {
    why = "TF_CONFIG is set";
    r = std::make_shared<TFConfigClusterResolver>();
  } else if (env_value("RANK") || env_value("WORLD_SIZE")) {
    why = "RANK or WORLD_SIZE is set (torchrun)";
    r = std::make_shared<TorchrunClusterResolver>();
  } else if (env_value("OMPI_COMM_WORLD_RANK")) {
    why = "OMPI_COMM_WORLD_RANK is set (Open MPI)";
    r = std::make_shared<MPIClusterResolver>();
  } else if (env_value("SLURM_STEP_ID") && procid && !mpi_ranks_differ_from_slurm_tasks(*procid)) {
    why = "SLURM_STEP_ID and SLURM_PROCID are set (a task of a Slurm job step)";
    r = std::make_shared<SlurmClusterResolver>(std::map<std::string, int>{}, slurm_port_base());
  } else if (env_value("PMI_RANK") || env_value("PMIX_RANK")) {
    why = "PMI_RANK or PMIX_RANK is set (an MPI launcher)";
    r = std::make_shared<MPIClusterResolver>();
  } else {
    why = "no launcher's variables are set: a single local worker";
    r = std::make_shared<TFConfigClusterResolver>();
  }
  MIRRORED_LOG(info, "cluster_resolver_from_environment: ", why, "; the cluster comes from ", r->source(), ": task ",
               r->task_type().empty() ? "worker" : r->task_type(), " ", r->task_id(), " of ",
               std::max(1, r->cluster_spec().num_tasks("chief") + r->cluster_spec().num_tasks("worker")), " workers");
  return r;
}

}  // namespace mirrored
