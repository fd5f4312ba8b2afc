// ReductionToOneDevice: every sum formed on one device, in replica order; works for any devices.
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "collectives/to_one_device/on_chip_all_reduce.hpp"
#include "mirrored/cross_device_ops.hpp"

namespace mirrored {

ReductionToOneDevice::ReductionToOneDevice(std::optional<std::string> reduce_to_device) {
  if (reduce_to_device) reduce_to_device_ = Device::parse(*reduce_to_device);
}

void ReductionToOneDevice::reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                  const detail::UntypedTensor& out) {
  std::vector<const detail::UntypedTensor*> parts;
  for (const auto& t : per_replica) parts.push_back(&t);
  const int n = static_cast<int>(per_replica.size());
  detail::sum_parts_on(parts, out, reduce_to_device_.value_or(per_replica.at(0).device()),
                       op == ReduceOp::MEAN ? n : 0);
}

void ReductionToOneDevice::all_reduce(ReduceOp op, CollectiveStep& step) {
  // Logical GPUs sharing one chip: one kernel there reads every input and writes every output.
  if (!reduce_to_device_ && detail::on_chip_all_reduce(op, step)) return;
  std::vector<std::size_t> leaves(step.outputs(step.replica()).size());
  for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i] = i;
  detail::all_reduce_via_first(op, step, leaves, reduce_to_device_);
}

void ReductionToOneDevice::all_gather(int axis, CollectiveStep& step) { detail::gather_into_own_outputs(axis, step); }

}  // namespace mirrored
