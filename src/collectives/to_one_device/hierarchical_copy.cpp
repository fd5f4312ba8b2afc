// HierarchicalCopyAllReduce: TF's hierarchical copy, through the device backends (so it runs on
// any devices and is tested on host replicas).
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "collectives/ops_selection.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

HierarchicalCopyAllReduce::HierarchicalCopyAllReduce(int num_packs) : num_packs_(num_packs) {
  MIRRORED_ENFORCE(num_packs >= 0, InvalidArgumentError, "HierarchicalCopyAllReduce: num_packs must be >= 0, got ",
                   num_packs);
}

void HierarchicalCopyAllReduce::reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                                       const detail::UntypedTensor& out) {
  const int n = static_cast<int>(per_replica.size());
  detail::check_hierarchical_replicas(n);
  // Into one destination: sum in replica order on the first replica's device (as TF reduces to
  // one device), then copy out.
  std::vector<const detail::UntypedTensor*> parts;
  for (const auto& t : per_replica) parts.push_back(&t);
  detail::sum_parts_on(parts, out, per_replica[0].device(), op == ReduceOp::MEAN ? n : 0);
}

void HierarchicalCopyAllReduce::all_reduce(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  detail::check_hierarchical_replicas(n);  // every replica throws alike
  const std::size_t leaves = step.outputs(me).size();
  auto group_parts = [&](int begin, int size, std::size_t i) {
    std::vector<const detail::UntypedTensor*> parts;
    for (int r = begin; r < begin + size; ++r) parts.push_back(&step.inputs(r)[i]);
    return parts;
  };
  // 1. Each main device sums its half into its own output.
  for (std::size_t i = 0; i < leaves; ++i) {
    const auto h = detail::hierarchical_roles(n, i);
    const detail::UntypedTensor& out = step.outputs(me)[i];
    if (me == h.first_main) detail::sum_parts_on(group_parts(h.first_begin, h.group_size, i), out, out.device(), 0);
    if (me == h.second_main) detail::sum_parts_on(group_parts(h.second_begin, h.group_size, i), out, out.device(), 0);
  }
  step.sync();
  // 2. The first main adds the second main's partial sum (and divides for MEAN).
  for (std::size_t i = 0; i < leaves; ++i) {
    const auto h = detail::hierarchical_roles(n, i);
    if (me != h.first_main) continue;
    const detail::UntypedTensor& out = step.outputs(me)[i];
    detail::sum_parts_on({&out, &step.outputs(h.second_main)[i]}, out, out.device(), op == ReduceOp::MEAN ? n : 0);
  }
  step.sync();
  // 3. The second main takes the total.
  for (std::size_t i = 0; i < leaves; ++i) {
    const auto h = detail::hierarchical_roles(n, i);
    if (me != h.second_main) continue;
    const auto& mine = step.outputs(me)[i];
    const auto& total = step.outputs(h.first_main)[i];
    detail::copy_between(mine.data(), mine.device(), total.data(), total.device(), mine.bytes());
  }
  step.sync();
  // 4. Everyone else copies from the main of its half.
  for (std::size_t i = 0; i < leaves; ++i) {
    const auto h = detail::hierarchical_roles(n, i);
    const int main = h.main_of(me);
    if (main == me) continue;
    const auto& mine = step.outputs(me)[i];
    const auto& total = step.outputs(main)[i];
    detail::copy_between(mine.data(), mine.device(), total.data(), total.device(), mine.bytes());
  }
}

void HierarchicalCopyAllReduce::all_gather(int axis, CollectiveStep& step) {
  detail::gather_into_own_outputs(axis, step);
}

}  // namespace mirrored
