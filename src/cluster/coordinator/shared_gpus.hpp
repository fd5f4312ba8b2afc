#pragma once
// Private: the start-up check that no two workers of one machine took the same GPU by default
// (MultiWorkerMirroredStrategy without local_devices). A worker's share of its machine's GPUs
// comes from its resolver's place on the machine; where a resolver does not know it (TF_CONFIG,
// tools/launch.sh) or views are set the same for every worker (one CUDA_VISIBLE_DEVICES for all),
// the workers, once joined, compare how their machine names the GPUs each took
// (runtime/worker_gpus.hpp, machine_gpu_name) and fail rather than share a chip silently.

#include <optional>
#include <string>
#include <vector>

#include "cluster/coordinator/coordinator.hpp"
#include "cluster/transport/peers.hpp"

namespace mirrored::detail::cluster {

/// Two workers of one machine that took the same GPU.
struct SharedGpu {
  int first = 0;    ///< the lower rank
  int second = 0;   ///< the higher rank
  std::string gpu;  ///< the GPU's name on the machine
  friend bool operator==(const SharedGpu&, const SharedGpu&) = default;
};

/// The first pair of workers (the lowest second rank, then the lowest first) that run on one
/// machine (the same host name and kernel instance) and whose `default_gpus` (the names of the
/// GPUs each took by default) share a name; none when there is no such pair.
std::optional<SharedGpu> first_shared_gpu(const std::vector<WorkerInfo>& workers);

/// After `c` has joined: whether two workers of one machine took the same GPU by default, from the
/// GPUs each told when it joined (`WorkerInfo::default_gpus`; empty: none, or its devices were given).
/// \throws InvalidArgumentError, on every worker alike, naming the first two workers of one machine
/// that took the same GPU and how to give each its own.
void check_default_gpus_not_shared(const Coordinator& c);

}  // namespace mirrored::detail::cluster
