// MPIClusterResolver: the variables of MPI launchers (Open MPI, PMIx, MPICH's and Intel MPI's Hydra).
#include "cluster/resolvers/launcher_env.hpp"
#include "mirrored/cluster_resolver.hpp"

namespace mirrored {

MPIClusterResolver::MPIClusterResolver(std::string rpc_layer)
    : SettledClusterResolver({}, "worker", 0, std::move(rpc_layer)) {
  using namespace detail::cluster;
  constexpr const char* kWho = "MPIClusterResolver";
  // Open MPI's mpirun sets its own variables and PMIX_RANK; Slurm's srun --mpi=pmi2 and Hydra set
  // PMI_RANK and PMI_SIZE. PMIx hands out the size through its API only.
  LauncherPlace place =
      launcher_place(kWho, "MPI's", env_number(kWho, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}),
                     env_number(kWho, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}),
                     env_number(kWho, {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}),
                     env_number(kWho, {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}));
  cluster_ = std::move(place.cluster);
  source_ = std::move(place.source);
  task_id_ = place.ranks.rank;
  local_rank_ = place.ranks.local_rank;
  local_size_ = place.ranks.local_size;
}

}  // namespace mirrored
