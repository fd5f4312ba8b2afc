#pragma once
// Private: small building blocks of device-independent collectives (used by
// HierarchicalCopyAllReduce and NcclAllReduce's host fallback).

#include <vector>

#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// Sums `parts` in the given order on `device` into `out` (which may alias a part; it may live on
/// another device), dividing by `mean_divisor` when it is > 0. Parts on other devices are staged
/// onto `device` unless its kernels can read them directly (same_memory). Complete on return.
void sum_parts_on(const std::vector<const UntypedTensor*>& parts, const UntypedTensor& out, const Device& device,
                  int64_t mean_divisor);

/// The plain all-reduce of some leaves of a step: replica 0 sums every replica's input in replica
/// order on its output's device into its output; after a sync the others copy it. Every replica
/// must call it with the same leaves; it syncs the step once.
void all_reduce_via_first(ReduceOp op, CollectiveStep& step, const std::vector<std::size_t>& leaves);

}  // namespace mirrored::detail
