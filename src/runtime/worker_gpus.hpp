#pragma once
// Private: which GPUs a worker of MultiWorkerMirroredStrategy takes when it is given no
// `local_devices`: its share of its machine's GPUs, by its place among the workers a launcher
// started there (ClusterResolver::local_placement), so that workers of one machine never land on
// the same chip. The rule is a pure function, tested case by case (tests/cluster/test_worker_gpus.cpp);
// default_worker_devices applies it to the GPUs this process sees.

#include <optional>
#include <string>
#include <vector>

#include "mirrored/cluster_resolver.hpp"
#include "mirrored/device.hpp"

namespace mirrored::detail {

/// A worker's share of the physical GPUs it sees: those of index [first, first + count) in the
/// order the process sees them, each with every logical GPU split from it.
struct GpuShare {
  int first = 0;
  int count = 0;    ///< 0: no GPU is visible (the worker runs on CPU:0)
  std::string why;  ///< the reason, for the INFO line ("it is worker 1 of the 2 on its machine (…), …")
  friend bool operator==(const GpuShare&, const GpuShare&) = default;
};

/// The rule for a worker at `place` (r = local_rank of n = local_size) that sees `gpus` (G)
/// physical GPUs; `cuda_visible_devices` is that variable's value when it is set and not empty,
/// and `worker` names the worker in messages ("worker 1 (host:port)"):
///  1. G = 0: none (CPU:0);
///  2. n = 1 (alone on its machine, or the launcher does not say): all G;
///  3. the launcher gave each worker its own `gpus_per_worker` GPUs (Slurm's `--gpus-per-task`)
///     and G is no more than that: all G (the view is the worker's own);
///  4. G >= n: the r-th of n equal shares, [r·G/n, (r+1)·G/n); G not a multiple of n is an error;
///  5. G < n: with CUDA_VISIBLE_DEVICES set, each worker was given a view of its own (the launcher
///     or a wrapper set it per worker): all G; without it every worker sees the machine's G GPUs,
///     too few for one each, so taking any would share a chip with another worker: an error.
/// \throws InvalidArgumentError for the errors of 4 and 5, naming the worker, G, n, the variables
/// the place comes from and how to choose (`local_devices`, the examples' `--devices`); and for a
/// place that is not one (`local_rank` outside [0, `local_size`), a count below 0), naming it.
GpuShare share_of_gpus(const LocalPlacement& place, int gpus, const std::optional<std::string>& cuda_visible_devices,
                       const std::string& worker);

/// How the machine names the physical GPU this process sees as `ordinal`, the same in every
/// worker of the machine whatever its own view: its entry of `cuda_visible_devices` (an index, a
/// `GPU-` UUID or a `MIG-` id, as the variable gives it) when set, else the ordinal; within the
/// container's GPUs when `nvidia_visible_devices` (set by the NVIDIA container runtime) is set and
/// not "all" ("0 of NVIDIA_VISIBLE_DEVICES=2,3"), so that workers of different containers never
/// name different GPUs alike.
std::string machine_gpu_name(int ordinal, const std::optional<std::string>& cuda_visible_devices,
                             const std::optional<std::string>& nvidia_visible_devices);

/// A worker's default devices.
struct DefaultDevices {
  std::vector<Device> devices;
  /// `machine_gpu_name` of each physical GPU taken, for the workers' check that no two of one
  /// machine took the same (cluster/coordinator/shared_gpus.hpp).
  std::vector<std::string> gpu_names;
};

/// This worker's default devices: its share (`share_of_gpus`, with this process's
/// CUDA_VISIBLE_DEVICES) of the physical GPUs it sees, each with all its logical GPUs, in order;
/// `{CPU:0}` when it sees none. Logs at INFO which it took and why.
/// \throws InvalidArgumentError as `share_of_gpus` does.
DefaultDevices default_worker_devices(const LocalPlacement& place, const std::string& worker);

}  // namespace mirrored::detail
