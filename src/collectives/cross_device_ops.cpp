// The CrossDeviceOps interface's defaults and the contract's default choice.
#include "mirrored/cross_device_ops.hpp"

#include "collectives/collective_helpers.hpp"
#include "collectives/ops_selection.hpp"
#include "device/gpu_platform.hpp"
#include "device/placement.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {
namespace detail {

bool nccl_can_run() noexcept { return nccl_compiled_in() && gpus_are_physical(); }

std::shared_ptr<CrossDeviceOps> select_cross_device_ops(const std::vector<Device>& devices) {
  std::vector<ReplicaPlacement> placements;
  placements.reserve(devices.size());
  bool any_gpu = false;
  for (const Device& d : devices) {
    any_gpu = any_gpu || !d.is_host();
    placements.push_back(d.is_host() ? ReplicaPlacement{DeviceType::CPU, -1}
                                     : ReplicaPlacement{DeviceType::GPU, physical_gpu_of(d)});
  }
  // NCCL only where it can serve the GPUs (not on simulated ones); host-only strategies never ask
  // the GPU runtime.
  const bool nccl = any_gpu && nccl_can_run();
  switch (choose_cross_device_ops(placements, nccl)) {
    case CrossDeviceOpsChoice::in_process_all_reduce: return std::make_shared<InProcessAllReduce>();
    case CrossDeviceOpsChoice::nccl_all_reduce: return std::make_shared<NcclAllReduce>();
    case CrossDeviceOpsChoice::reduction_to_one_device: break;
  }
  return std::make_shared<ReductionToOneDevice>();
}

}  // namespace detail

CrossDeviceOps::~CrossDeviceOps() = default;

void CrossDeviceOps::unsupported(const char* op) const { throw UnimplementedError(name() + " does not support " + op); }

void CrossDeviceOps::reduce(ReduceOp, const std::vector<detail::UntypedTensor>&, const detail::UntypedTensor&) {
  unsupported("reduce");
}
void CrossDeviceOps::reduce_part(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                 const detail::UntypedTensor& out, int part, int /*parts*/) {
  if (part == 0) reduce(op, per_replica, out);
}
void CrossDeviceOps::all_reduce(ReduceOp, CollectiveStep&) { unsupported("all_reduce"); }
void CrossDeviceOps::all_gather(int, CollectiveStep&) { unsupported("all_gather"); }

void CrossDeviceOps::reduce_scatter(ReduceOp op, CollectiveStep& step) {
  const int me = step.replica();
  const int n = step.num_replicas();
  std::vector<const detail::UntypedTensor*> parts;
  parts.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) parts.push_back(&step.inputs(r)[0]);
  const detail::UntypedTensor& out = step.outputs(me)[0];
  detail::sum_range_on(parts, detail::split_begin(step.split(), me), out, out.device(), op == ReduceOp::MEAN ? n : 0);
}

bool CrossDeviceOps::all_reduce_and_update(CollectiveStep&) { return false; }
bool CrossDeviceOps::batch_all_reduce(ReduceOp, const std::vector<std::vector<detail::UntypedTensor>>&,
                                      const std::vector<Device>&, std::vector<std::vector<detail::UntypedTensor>>&,
                                      const Deadline&) {
  return false;
}

}  // namespace mirrored
