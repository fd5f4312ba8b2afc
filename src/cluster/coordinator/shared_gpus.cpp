// Workers of one machine that took the same GPU by default (shared_gpus.hpp).
#include "cluster/coordinator/shared_gpus.hpp"

#include <algorithm>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

// Never empty (a set of an empty value reads as one), one name a line.
std::string encode(const std::vector<std::string>& names) {
  std::string out = "gpus:";
  for (std::string n : names) {
    std::replace(n.begin(), n.end(), '\n', ' ');
    out += "\n" + n;
  }
  return out;
}

std::vector<std::string> decode(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = text.find('\n');
  while (start != std::string::npos) {
    const std::size_t end = text.find('\n', start + 1);
    out.push_back(text.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1));
    start = end;
  }
  return out;
}

}  // namespace

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

void check_default_gpus_not_shared(Coordinator& c, const std::vector<std::string>& mine, double timeout_s) {
  const std::string key = c.prefix() + "default_gpus/";
  c.store().set(key + std::to_string(c.rank()), encode(mine));
  std::vector<std::string> keys;
  for (int w = 0; w < c.num_workers(); ++w) keys.push_back(key + std::to_string(w));
  MIRRORED_ENFORCE(c.store().wait(keys, timeout_s).empty(), DeadlineExceededError,
                   "MultiWorkerMirroredStrategy: the workers did not say which GPUs they took within ", timeout_s,
                   " s");
  std::vector<std::vector<std::string>> all;
  for (const auto& k : keys) all.push_back(decode(c.store().get(k, 0).value_or("")));
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
