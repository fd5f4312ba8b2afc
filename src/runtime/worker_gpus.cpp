// The default GPUs of a worker of MultiWorkerMirroredStrategy (worker_gpus.hpp).
#include "runtime/worker_gpus.hpp"

#include <algorithm>
#include <cstdlib>

#include "device/placement.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

std::string gpus_text(int n) { return str_cat(n, n == 1 ? " GPU" : " GPUs"); }

// "1, 2 or 4": the numbers of workers per machine that divide `gpus` GPUs evenly.
std::string divisors(int gpus) {
  std::vector<int> d;
  for (int k = 1; k <= gpus; ++k)
    if (gpus % k == 0) d.push_back(k);
  std::string out;
  for (std::size_t i = 0; i < d.size(); ++i) out += str_cat(i == 0 ? "" : i + 1 == d.size() ? " or " : ", ", d[i]);
  return out;
}

}  // namespace

GpuShare share_of_gpus(const LocalPlacement& place, int gpus, const std::optional<std::string>& cuda_visible_devices,
                       const std::string& worker) {
  const int r = place.local_rank, n = place.local_size;
  const std::string from = place.source.empty() ? "as its cluster resolver says" : place.source;
  MIRRORED_ENFORCE(n >= 1 && r >= 0 && r < n && place.gpus_per_worker >= 0 && gpus >= 0, InvalidArgumentError,
                   "MultiWorkerMirroredStrategy: ", worker,
                   " has no place among the workers of its machine: local_rank ", r, " of local_size ", n,
                   ", gpus_per_worker ", place.gpus_per_worker, " (", from,
                   "); the local rank must be from 0 to local_size - 1");
  if (gpus == 0) return {0, 0, "no GPU is visible"};
  if (n == 1) {
    return {0, gpus,
            place.source.empty() ? "its cluster resolver names no other worker on its machine"
                                 : str_cat("it is the only worker on its machine (", from, ")")};
  }
  const std::string local = str_cat("local worker ", r, " of the ", n, " on its machine (", from, ")");
  const std::string who = str_cat(worker, " is ", local), place_text = "it is " + local;
  if (place.gpus_per_worker > 0 && gpus <= place.gpus_per_worker) {
    return {
        0, gpus,
        str_cat(place_text, ", and the launcher gave each of them ", gpus_text(place.gpus_per_worker), " of its own")};
  }
  if (gpus >= n) {
    MIRRORED_ENFORCE(gpus % n == 0, InvalidArgumentError, "MultiWorkerMirroredStrategy: ", who, " and sees ",
                     gpus_text(gpus), ", which do not divide evenly among ", n,
                     " workers: choose each worker's GPUs with local_devices (the examples' --devices), or run ",
                     divisors(gpus), " workers on each machine");
    const int each = gpus / n;
    return {r * each, each, str_cat(place_text, ", each of which takes ", gpus_text(each))};
  }
  MIRRORED_ENFORCE(cuda_visible_devices.has_value(), InvalidArgumentError, "MultiWorkerMirroredStrategy: ", who,
                   " but sees only ", gpus_text(gpus),
                   ", and no CUDA_VISIBLE_DEVICES gives it a view of its own: the machine's ", n,
                   " workers cannot each have a GPU of their own. Run at most ", gpus,
                   " workers on this machine, give each worker GPUs of its own (CUDA_VISIBLE_DEVICES per worker, "
                   "Slurm's --gpus-per-task), or choose its devices with local_devices (the examples' --devices; "
                   "workers that share a GPU cannot use NCCL)");
  return {0, gpus,
          str_cat(place_text, " and sees fewer GPUs than that, so CUDA_VISIBLE_DEVICES=", *cuda_visible_devices,
                  " is its own view")};
}

std::string machine_gpu_name(int ordinal, const std::optional<std::string>& cuda_visible_devices,
                             const std::optional<std::string>& nvidia_visible_devices) {
  std::string name = std::to_string(ordinal);
  if (cuda_visible_devices) {
    std::vector<std::string> entries{""};
    for (char c : *cuda_visible_devices) {
      if (c == ',')
        entries.emplace_back();
      else if (c != ' ')
        entries.back() += c;
    }
    name = static_cast<std::size_t>(ordinal) < entries.size()
               ? entries[static_cast<std::size_t>(ordinal)]
               : str_cat(ordinal, " of CUDA_VISIBLE_DEVICES=", *cuda_visible_devices);
  }
  if (nvidia_visible_devices && *nvidia_visible_devices != "all")
    name += str_cat(" of NVIDIA_VISIBLE_DEVICES=", *nvidia_visible_devices);
  return name;
}

DefaultDevices default_worker_devices(const LocalPlacement& place, const std::string& worker) {
  const std::vector<Device> logical = list_logical_devices(DeviceType::GPU);
  // The physical GPUs in the order the process sees them, each with its logical GPUs.
  std::vector<int> chips;
  std::vector<std::vector<Device>> on_chip;
  for (const Device& d : logical) {
    const int chip = physical_gpu_of(d);
    const auto at = static_cast<std::size_t>(std::find(chips.begin(), chips.end(), chip) - chips.begin());
    if (at == chips.size()) {
      chips.push_back(chip);
      on_chip.emplace_back();
    }
    on_chip[at].push_back(d);
  }
  const auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v && *v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto visible = env("CUDA_VISIBLE_DEVICES");
  const GpuShare share = share_of_gpus(place, static_cast<int>(chips.size()), visible, worker);
  if (share.count == 0) {
    MIRRORED_LOG(info, "MultiWorkerMirroredStrategy: ", worker, " runs on CPU:0: ", share.why);
    return {{Device(DeviceType::CPU, 0)}, {}};
  }
  DefaultDevices out;
  std::string names;
  for (int c = share.first; c < share.first + share.count; ++c) {
    const auto k = static_cast<std::size_t>(c);
    out.gpu_names.push_back(machine_gpu_name(chips[k], visible, env("NVIDIA_VISIBLE_DEVICES")));
    for (const Device& d : on_chip[k]) {
      out.devices.push_back(d);
      names += (names.empty() ? "" : ", ") + d.short_name();
    }
  }
  const int seen = static_cast<int>(chips.size());
  MIRRORED_LOG(
      info, "MultiWorkerMirroredStrategy: ", worker, " takes ", names, " (",
      share.count == seen ? "every GPU it sees" : str_cat(share.count, " of the ", gpus_text(seen), " it sees"),
      "): ", share.why, "; local_devices chooses otherwise");
  return out;
}

}  // namespace mirrored::detail
