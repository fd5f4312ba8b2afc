// MPIClusterResolver: the variables of MPI launchers (Open MPI, PMIx, MPICH's and Intel MPI's Hydra).
#include "mirrored/cluster_resolver.hpp"

namespace mirrored {

// Open MPI's mpirun sets its own variables and PMIX_RANK; Slurm's srun --mpi=pmi2 and Hydra set
// PMI_RANK and PMI_SIZE. PMIx hands out the size through its API only.
MPIClusterResolver::MPIClusterResolver(std::string rpc_layer)
    : LauncherClusterResolver("MPIClusterResolver", "MPI's", {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"},
                              {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, std::move(rpc_layer)) {}

}  // namespace mirrored
