// Workers of one machine that took the same GPU by default (shared_gpus.hpp).
#include "cluster/coordinator/shared_gpus.hpp"

#include <map>
#include <tuple>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

std::optional<SharedGpu> first_shared_gpu(const std::vector<WorkerInfo>& workers) {
  // One pass in rank order: each (machine, GPU) remembers the first worker that took it, so the
  // check costs the GPUs taken, not the pairs of workers.
  std::map<std::tuple<std::string, std::string, std::string>, int> first_taker;
  for (std::size_t b = 0; b < workers.size(); ++b) {
    const WorkerInfo& w = workers[b];
    std::optional<SharedGpu> found;
    for (const std::string& g : w.default_gpus) {
      const auto [at, fresh] = first_taker.emplace(std::make_tuple(w.hostname, w.boot_id, g), static_cast<int>(b));
      if (!fresh && at->second != static_cast<int>(b) && (!found || at->second < found->first))
        found = SharedGpu{at->second, static_cast<int>(b), g};
    }
    if (found) return found;
  }
  return std::nullopt;
}

void check_default_gpus_not_shared(const Coordinator& c) {
  const auto shared = first_shared_gpu(c.workers());
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
