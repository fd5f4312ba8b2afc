#pragma once
// Private: the building blocks of device-independent collectives, shared by every CrossDeviceOps
// (ReductionToOneDevice, HierarchicalCopyAllReduce, and the host fallbacks of the others).

#include <functional>
#include <optional>
#include <vector>

#include "mirrored/collective_step.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored::detail {

/// Part `part` of `parts` of a piece of work.
using PartFn = std::function<void(int part, int parts)>;
/// Runs `fn` on idle threads (the replicas' pool), every part at once, and returns true (an
/// exception of a part is rethrown); or returns false, having run nothing, when there are none
/// idle now. The runtime gives the collective plan one; empty: everything on the calling thread.
using Parallel = std::function<bool(const PartFn& fn)>;

/// Sums `parts` in the given order on `device` into `out` (which may alias a part; it may live on
/// another device), dividing by `mean_divisor` when it is > 0. Parts on other devices are staged
/// onto `device` unless its kernels can read them directly (same_memory: the sum then waits for
/// their streams on the device, not on the host). An `out` on `device` is written in the order of
/// its stream (synchronize before reading it from the host or another stream); one elsewhere is
/// complete on return.
void sum_parts_on(const std::vector<const UntypedTensor*>& parts, const UntypedTensor& out, const Device& device,
                  int64_t mean_divisor);

/// `sum_parts_on` of elements [begin, begin + out.numel) of every part (each flattened) into `out`:
/// one replica's piece of a reduce-scatter.
void sum_range_on(const std::vector<const UntypedTensor*>& parts, int64_t begin, const UntypedTensor& out,
                  const Device& device, int64_t mean_divisor);

/// `ReplicaContext::reduce_scatter`'s cut of `in` over `num_replicas` replicas (every worker's):
/// fills `split` with every replica's piece in elements (its BALANCED share of the rows, times the
/// elements of a row) and returns the shape of replica `replica`'s slice. \throws
/// InvalidArgumentError for a rank-0 `in`, naming the replica.
Shape reduce_scatter_piece(const UntypedTensor& in, int replica, int num_replicas, std::vector<int64_t>& split);

/// The address of element `element` of `t` (flattened), in `t`'s memory.
inline unsigned char* element_at(const UntypedTensor& t, int64_t element) {
  return static_cast<unsigned char*>(t.data()) + element * static_cast<int64_t>(dtype_size(t.dtype));
}

/// Where replica `r`'s piece of a reduce-scatter begins: the sum of the pieces before it.
int64_t split_begin(const std::vector<int64_t>& split, int r) noexcept;

/// The plain all-reduce of some leaves of a step: replica 0 sums every replica's input in replica
/// order on `on` (default: its output's device) into its output; after a sync the others copy
/// it. Every replica must call it with the same leaves; it syncs the step once.
void all_reduce_via_first(ReduceOp op, CollectiveStep& step, const std::vector<std::size_t>& leaves,
                          const std::optional<Device>& on = std::nullopt);

/// Fills this replica's outputs with the concatenation along `axis` of every replica's inputs.
void gather_into_own_outputs(int axis, CollectiveStep& step);

/// The shape of the concatenation along `axis` (negative counts from the end; made non-negative
/// here) of tensors of `shapes`, one per replica in replica order. \throws InvalidArgumentError
/// naming `op` and both replicas' shapes for a rank-0 value, different ranks or shapes that differ
/// off `axis`, and for an axis out of range.
Shape concat_shape(const char* op, const std::vector<const Shape*>& shapes, int& axis);

/// Concatenates `parts` (equal rank, equal dims except `axis`) along `axis` into `out`. A large
/// concatenation of host parts along the first axis (or one whose earlier axes are all 1) is split
/// over `parallel`'s threads, the parts' bytes written around the cache.
void concat_into(const std::vector<const UntypedTensor*>& parts, int axis, const UntypedTensor& out,
                 const Parallel& parallel = {});

}  // namespace mirrored::detail
