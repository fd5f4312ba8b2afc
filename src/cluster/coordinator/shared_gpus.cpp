// Workers of one machine that took the same GPU by default (shared_gpus.hpp).
#include "cluster/coordinator/shared_gpus.hpp"

#include <algorithm>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

std::optional<SharedGpu> first_shared_gpu(const std::vector<WorkerInfo>& workers,
                                          const std::vector<std::vector<std::string>>& gpus) {
  const std::size_t n = std::min(workers.size(), gpus.size());
  for (std::size_t b = 1; b < n; ++b) {
    for (std::size_t a = 0; a < b; ++a) {
      if (workers[a].hostname != workers[b].hostname || workers[a].boot_id != workers[b].boot_id) continue;
      for (const std::string& g : gpus[a]) {
        if (std::find(gpus[b].begin(), gpus[b].end(), g) != gpus[b].end())
          return SharedGpu{static_cast<int>(a), static_cast<int>(b), g};
      }
    }
  }
  return std::nullopt;
}

void check_default_gpus_not_shared(const Coordinator& c) {
  std::vector<std::vector<std::string>> all;
  for (const WorkerInfo& w : c.workers()) all.push_back(w.default_gpus);
  const auto shared = first_shared_gpu(c.workers(), all);
  if (!shared) return;
  throw InvalidArgumentError(str_cat(
      "MultiWorkerMirroredStrategy: ", c.name(shared->first), " and ", c.name(shared->second), " run on one machine (",
      c.workers()[static_cast<std::size_t>(shared->first)].hostname, ") and both took its GPU ", shared->gpu,
      " by default: their cluster resolver does not say where each stands on the machine (TF_CONFIG does not), "
      "or their CUDA_VISIBLE_DEVICES is the same. Give each worker GPUs of its own: local_devices (the examples' "
      "--devices), CUDA_VISIBLE_DEVICES per worker, or a launcher whose resolver says each worker's place "
      "(torchrun, mpirun, srun)"));
}

}  // namespace mirrored::detail::cluster
