#pragma once
// Private: what the launchers' resolvers (torchrun, MPI, Slurm) share — numbers read from
// environment variables that several launchers may name differently (and must then agree), and
// the rendezvous address of launchers that name only the chief's. LauncherClusterResolver's
// constructor (<mirrored/cluster_resolver.hpp>) is implemented with them in launcher_env.cpp.

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "mirrored/cluster_resolver.hpp"

namespace mirrored::detail::cluster {

/// The value of environment variable `name` when it is set and not empty.
std::optional<std::string> env_value(const char* name);

/// A number named by any of several variables (`OMPI_COMM_WORLD_RANK`, `PMIX_RANK`, `PMI_RANK`).
struct EnvNumber {
  std::optional<int> value;        ///< unset when none of the variables is set
  std::vector<std::string> shown;  ///< "NAME=value" of each variable that is set, in the order given
  std::string names;               ///< "RANK", or "OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK"
};

/// Reads every variable of `names` that is set: each must be a non-negative decimal number (at
/// most 9 digits) and all must agree. \throws InvalidArgumentError naming `resolver` and the
/// variables ("MPIClusterResolver: OMPI_COMM_WORLD_RANK=1 and PMIX_RANK=0 disagree").
EnvNumber env_number(const char* resolver, std::initializer_list<const char*> names);

/// "A=1, B=2" from the `shown` of several numbers (and any other "NAME=value" texts).
std::string join_shown(const std::vector<std::string>& shown);

/// A worker's place as a launcher states it.
struct Ranks {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  ///< 0 when the launcher does not say
  int local_size = 1;  ///< 1 when the launcher does not say
};

/// Checks what holds under every launcher: the rank and the size are set, the size is at least 1,
/// the rank is below the size, the local rank below the local size (when both are set), the local
/// size at most the size, and the local rank at most the rank (ranks are dealt to the machines in
/// order). \throws InvalidArgumentError naming `resolver` and the variables with their values.
Ranks check_ranks(const char* resolver, const EnvNumber& rank, const EnvNumber& size, const EnvNumber& local_rank,
                  const EnvNumber& local_size);

/// The rendezvous address: `MIRRORED_MASTER_ADDR` (else `MASTER_ADDR`) and `MIRRORED_MASTER_PORT`
/// (else `MASTER_PORT`).
struct Rendezvous {
  std::string address;             ///< "host:port" ("[v6]:port" for an IPv6 host); empty when unset
  std::vector<std::string> shown;  ///< "NAME=value" of the variables read
};

/// Reads the rendezvous address. `needed`: the job has several workers, so both the host and the
/// port must be set. \throws InvalidArgumentError naming `resolver` and the variables for a missing
/// host or port when needed, or a port that is not a number in 1..65535 (whenever set).
Rendezvous rendezvous_from_env(const char* resolver, bool needed);

/// The cluster of a launcher that names only the chief: `size` "worker" tasks, task 0 at
/// `chief_address`, the others' addresses empty (published when they join). Empty for one worker.
ClusterSpec rendezvous_cluster(const std::string& chief_address, int size);

}  // namespace mirrored::detail::cluster
