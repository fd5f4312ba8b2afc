// The cross-worker stage of a strategy of one worker (worker_stage.hpp): the local CrossDeviceOps
// does the whole collective.
#include "collectives/collective_group.hpp"
#include "collectives/collective_helpers.hpp"
#include "collectives/worker_stage.hpp"

namespace mirrored::detail {

void LocalStage::all_reduce(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* /*group*/) {
  local.all_reduce(op, step);
}

void LocalStage::reduce_scatter(ReduceOp op, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* /*group*/) {
  local.reduce_scatter(op, step);
}

void LocalStage::all_gather(int axis, CrossDeviceOps& local, CollectiveStep& step, CollectiveGroup* /*group*/,
                            std::vector<UntypedTensor>& outs) {
  // Every replica computes the same shape from every replica's input, so all of them raise the
  // same error, if any.
  std::vector<const Shape*> shapes;
  for (int r = 0; r < step.num_replicas(); ++r) shapes.push_back(&step.inputs(r)[0].shape);
  int a = axis;
  const Shape shape = concat_shape("all_gather", shapes, a);
  const UntypedTensor& in = step.inputs(step.replica())[0];
  outs.push_back(make_untyped(in.dtype, shape, in.device()));
  step.sync();  // every replica's output exists before a backend may look at it
  local.all_gather(a, step);
}

UntypedTensor LocalStage::gather(const std::vector<UntypedTensor>& parts, int axis, const Deadline& /*deadline*/,
                                 const Parallel& parallel) {
  std::vector<const Shape*> shapes;
  for (const auto& p : parts) shapes.push_back(&p.shape);
  int a = axis;
  const Shape out_shape = concat_shape("gather", shapes, a);
  UntypedTensor out = make_untyped(parts[0].dtype, out_shape, cpu0);
  std::vector<const UntypedTensor*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  concat_into(ptrs, a, out, parallel);
  return out;
}

}  // namespace mirrored::detail
