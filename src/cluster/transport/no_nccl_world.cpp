// Builds without NCCL: no communicator spans the workers' GPUs; GPU replicas reduce across
// workers through host memory (src/cluster/coordinator/multi_worker_runtime.cpp). The NCCL implementation is
// src/cluster/transport/nccl/nccl_world.cpp.
#include "cluster/transport/world_all_reduce.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

WorldAllReduce::~WorldAllReduce() = default;

bool nccl_world_possible(const std::vector<Device>&) { return false; }

std::unique_ptr<WorldAllReduce> make_nccl_world_all_reduce(const std::vector<Device>&, int, int, KeyValueStore&,
                                                           const std::string&, double) {
  throw UnimplementedError("MultiWorkerMirroredStrategy: this build of mirrored has no NCCL");
}

}  // namespace mirrored::detail::cluster
