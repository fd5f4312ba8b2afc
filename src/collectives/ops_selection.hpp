#pragma once
/// Pure decision rules of the cross-device layer, written over a *described* machine so that
/// they can be tested without the hardware: which `CrossDeviceOps` a strategy gets by default,
/// and the roles of `HierarchicalCopyAllReduce`'s replicas (NcclAllReduce packs with packing.hpp's
/// planner, as every path does).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/cross_device_ops.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {

/// Where one replica runs, as far as choosing cross-device ops is concerned.
struct ReplicaPlacement {
  DeviceType type = DeviceType::CPU;
  /// For a GPU: the physical GPU behind the (possibly logical) device. Ignored for CPUs.
  int physical_gpu = -1;
};

/// The cross-device ops the contract's default rule can pick.
enum class CrossDeviceOpsChoice { in_process_all_reduce, nccl_all_reduce, reduction_to_one_device };

/// "InProcessAllReduce", "NcclAllReduce", "ReductionToOneDevice" (the classes' `name()`s).
inline const char* cross_device_ops_choice_name(CrossDeviceOpsChoice c) noexcept {
  switch (c) {
    case CrossDeviceOpsChoice::in_process_all_reduce: return "InProcessAllReduce";
    case CrossDeviceOpsChoice::nccl_all_reduce: return "NcclAllReduce";
    case CrossDeviceOpsChoice::reduction_to_one_device: break;
  }
  return "ReductionToOneDevice";
}

/// The contract's default choice (docs/api.md §7):
/// - every replica on a host device → `InProcessAllReduce`;
/// - every replica on a GPU, no two on the same physical GPU, NCCL available → `NcclAllReduce`
///   (NCCL refuses two ranks on one GPU);
/// - anything else (logical GPUs sharing a chip, CPU and GPU mixed, no NCCL) → the
///   reduce-to-one-device path (`ReductionToOneDevice`).
inline CrossDeviceOpsChoice choose_cross_device_ops(const std::vector<ReplicaPlacement>& replicas,
                                                    bool nccl_available) {
  const bool all_cpu = std::all_of(replicas.begin(), replicas.end(),
                                   [](const ReplicaPlacement& p) { return p.type == DeviceType::CPU; });
  if (all_cpu) return CrossDeviceOpsChoice::in_process_all_reduce;
  const bool all_gpu = std::all_of(replicas.begin(), replicas.end(),
                                   [](const ReplicaPlacement& p) { return p.type == DeviceType::GPU; });
  if (all_gpu && nccl_available) {
    std::set<int> physical;
    for (const auto& p : replicas) physical.insert(p.physical_gpu);
    if (physical.size() == replicas.size()) return CrossDeviceOpsChoice::nccl_all_reduce;
  }
  return CrossDeviceOpsChoice::reduction_to_one_device;
}

/// The contract's default choice for a set of replica devices, as an object.
std::shared_ptr<CrossDeviceOps> select_cross_device_ops(const std::vector<Device>& devices);

/// True when this build of the library contains the NCCL implementation of `NcclAllReduce`
/// (a CUDA build that found NCCL). Whether it can run also needs GPUs.
bool nccl_compiled_in() noexcept;

/// True when `NcclAllReduce` can run here: NCCL compiled in and the GPU runtime drives physical
/// GPUs (not simulated ones); the default cross-device ops choose it only then.
bool nccl_can_run() noexcept;

// ---------------------------------------------------------------------------------------------
// HierarchicalCopyAllReduce roles (TF's aggregate_gradients_using_hierarchical_copy).

/// Throws InvalidArgumentError unless `num_replicas` is even and at least 2.
inline void check_hierarchical_replicas(int num_replicas) {
  MIRRORED_ENFORCE(num_replicas >= 2 && num_replicas % 2 == 0, InvalidArgumentError,
                   "HierarchicalCopyAllReduce works only for an even number (>= 2) of devices; this strategy has ",
                   num_replicas, " replica", num_replicas == 1 ? "" : "s",
                   " (use ReductionToOneDevice or NcclAllReduce instead)");
}

/// Who does what for tensor `tensor_index` of a hierarchical all-reduce over `n` (even) replicas.
/// Replicas form two halves, [0, n/2) and [n/2, n). The first main device rotates with the tensor
/// index (`tensor_index % n`), the second is half a ring away; each sums its own half in replica
/// order, the first main adds the second's partial sum (first main's half first), and every
/// replica copies the total from the main of its own half.
struct HierarchicalRoles {
  int first_main = 0;    ///< sums its half, then the total
  int second_main = 0;   ///< sums its half, then receives the total
  int first_begin = 0;   ///< first replica of the first main's half
  int second_begin = 0;  ///< first replica of the second main's half
  int group_size = 0;    ///< n / 2
  /// The main replica `r` takes the total from (itself for the mains).
  int main_of(int r) const noexcept {
    const bool in_first = (r >= first_begin && r < first_begin + group_size);
    return in_first ? first_main : second_main;
  }
};

inline HierarchicalRoles hierarchical_roles(int n, std::size_t tensor_index) {
  check_hierarchical_replicas(n);
  HierarchicalRoles h;
  h.group_size = n / 2;
  h.first_main = static_cast<int>(tensor_index % static_cast<std::size_t>(n));
  h.second_main = (h.first_main + h.group_size) % n;
  h.first_begin = h.first_main < h.group_size ? 0 : h.group_size;
  h.second_begin = h.first_main < h.group_size ? h.group_size : 0;
  return h;
}

}  // namespace mirrored::detail
