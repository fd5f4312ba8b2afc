#pragma once
/// \file
/// Packing many tensors into few collectives: the one planner of every path (the in-process and
/// host reductions, the cross-replica reductions, the cross-worker sum and NCCL). A pack is a run
/// of consecutive tensors of one dtype on one device, reduced as one contiguous buffer; it closes
/// once full by `detail::pack_is_full` (the rule GradientBuckets shares).

#include <cstdint>
#include <utility>
#include <vector>

#include "mirrored/detail/pack_rule.hpp"
#include "mirrored/detail/untyped_tensor.hpp"

namespace mirrored::detail {

/// What the planner needs of one tensor.
struct PackLeaf {
  DType dtype;
  Device device;
  int64_t numel;
};

/// How to pack.
struct PackRule {
  int64_t bytes_per_pack = 0;  ///< CommunicationOptions::bytes_per_pack (0: one pack per run)
  bool one_leaf_each = false;  ///< every tensor a pack of its own (NcclAllReduce's num_packs = 0)
  bool skip_empty = false;     ///< leave tensors with no elements out of every pack
  int chunks = 1;              ///< calls per pack: near-equal element ranges (NcclAllReduce's num_packs)
  int max_leaves = 0;          ///< at most this many tensors a pack (0: no limit; a fused update's kMaxUpdateSegments)
};

/// One pack: leaves reduced as one contiguous run of elements of one dtype.
struct Pack {
  std::vector<std::size_t> leaves;                  ///< leaf indices, in order
  int64_t numel = 0;                                ///< total elements of those leaves
  std::vector<std::pair<int64_t, int64_t>> chunks;  ///< [begin, end) element ranges, one call each
  bool concatenated() const noexcept { return leaves.size() > 1; }
};

/// Plans the packs of `leaves` (in order) under `rule`. Each pack's `numel` is split into
/// `rule.chunks` near-equal chunks (the first `numel % chunks` get one element more; empty chunks
/// are dropped). \throws InvalidArgumentError for `rule.chunks` < 1 or a negative `bytes_per_pack`.
std::vector<Pack> plan_packs(const std::vector<PackLeaf>& leaves, const PackRule& rule);

/// NcclAllReduce's rule (TF's `num_packs`): `num_packs` = 0 is one call per leaf; k >= 1
/// concatenates each run of one dtype, closed at `bytes_per_pack` as every path's packs are, and
/// reduces each pack in k near-equal chunks. Leaves with no elements take no NCCL call.
PackRule nccl_pack_rule(int num_packs, int64_t bytes_per_pack);

/// The leaf indices of each pack of `tensors` with `bytes_per_pack` (the common case: one chunk per
/// pack, empty tensors kept).
std::vector<std::vector<std::size_t>> plan_packs(const std::vector<UntypedTensor>& tensors, int64_t bytes_per_pack);

}  // namespace mirrored::detail
