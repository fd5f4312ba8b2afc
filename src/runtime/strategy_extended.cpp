// StrategyExtended's compiled part: cross-replica reductions onto destinations, through the
// collective plan.
#include "mirrored/strategy.hpp"
#include "runtime/strategy_runtime.hpp"
#include "util/timeline.hpp"

namespace mirrored {

void StrategyExtended::require_cross_replica(const char* method) const { s_.require_cross_replica(method, ""); }

std::vector<std::vector<detail::UntypedTensor>> StrategyExtended::batch_reduce_onto(
    const char* method, ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& values,
    const std::vector<std::vector<Device>>& destinations, const CommunicationOptions& options) {
  detail::timeline::Scope trace(method, "cross_replica");  // `method` is a literal: "reduce_to", …
  if (trace.active()) {
    std::int64_t bytes = 0;
    for (const auto& v : values) bytes += v.empty() ? 0 : static_cast<std::int64_t>(v[0].bytes());
    trace.arg("op", reduce_op_name(op));
    trace.arg("tensors", static_cast<std::int64_t>(values.size()));
    trace.arg("bytes", bytes);
  }
  const Deadline deadline = Deadline::after(options.timeout_seconds.value_or(collective_timeout_seconds()));
  return s_.rt_->plan.batch_reduce(method, op, values, destinations, worker_devices(), options, deadline);
}

}  // namespace mirrored
