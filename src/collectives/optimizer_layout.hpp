#pragma once
// Private: how an optimizer step's variables are packed and, when the optimizer state is sharded,
// cut and laid out, shared by the device-generic step (optimizer_step.cpp: a reduce-scatter and
// an all-gather of the collective plan) and NCCL's fused one (nccl/nccl_optimizer_step.cpp: the
// same collectives and the update ordered on one stream), so that both pack, cut and update alike
// and give the same bits. ShardedPack is plain arithmetic (tests/collectives checks it at the
// edges); the functions below it copy with copy_between, so within one device they are ordered on
// the calling thread's stream like kernels.

#include <array>
#include <cstdint>
#include <vector>

#include "collectives/packing.hpp"
#include "mirrored/detail/optimizer_step.hpp"

namespace mirrored::detail {

/// The packs of a step's variables: runs on one device, closed by the pack rule
/// (`communication.bytes_per_pack`, one variable each when `pack` is false), at most
/// kMaxUpdateSegments variables each (one backend call), empty variables left out.
std::vector<Pack> optimizer_packs(const OptimizerStep& s);

/// One pack's variables (`numel[k]` elements each) cut into `num_shards` BALANCED slices each and
/// laid out shard-major: every variable's slice 0, then every variable's slice 1, and so on. A
/// reduce-scatter of the layout cut by `split()` hands shard q its slices of every variable, and an
/// all-gather of every shard's slices restores the layout.
class ShardedPack {
 public:
  /// Where variable k's slice of shard q lies: from element `in_variable` of the variable (flat),
  /// at element `in_layout` of the layout, `count` elements.
  struct Piece {
    int64_t in_variable;
    int64_t in_layout;
    int64_t count;
  };

  /// `num_shards` >= 1 (every replica of every worker).
  ShardedPack(std::vector<int64_t> numel, int64_t num_shards);

  int64_t num_shards() const noexcept { return shards_; }
  std::size_t num_variables() const noexcept { return numel_.size(); }
  /// Elements of the whole layout (of every variable).
  int64_t numel() const noexcept { return total_; }
  /// Elements of each shard's slices, in shard order (the reduce-scatter's cut).
  const std::vector<int64_t>& split() const noexcept { return split_; }
  /// Where shard q's slices begin in the layout.
  int64_t shard_begin(int64_t q) const noexcept { return begin_[static_cast<std::size_t>(q)]; }
  /// True when every shard has as many elements (NCCL's ncclReduceScatter and ncclAllGather take
  /// equal counts; otherwise one call per shard).
  bool equal_split() const noexcept;
  /// Variable k's slice of shard q.
  Piece piece(int64_t q, std::size_t k) const noexcept;

 private:
  std::vector<int64_t> numel_;
  int64_t shards_;
  int64_t total_ = 0;
  std::vector<int64_t> split_, begin_;
};

/// The layout of pack `pack` of `s`, cut into `num_shards`.
ShardedPack sharded_pack(const OptimizerStep& s, const Pack& pack, int64_t num_shards);

/// `whole[k]` (the pack's variables' tensors: gradients or parameters, on any device) packed in
/// `layout` into a new `dtype` tensor on `device`: every shard (`only` < 0) or only shard `only`'s
/// slices (its `split()` elements).
UntypedTensor pack_shard_major(const ShardedPack& layout, const std::vector<const UntypedTensor*>& whole, int64_t only,
                               DType dtype, const Device& device);

/// Where a shard's update writes instead of the variables themselves (a step that commits only
/// once it completed): shard `me`'s slices of the parameters packed in `params_slice` (as
/// pack_shard_major(..., me, ...) packs them), and per variable k of the pack copies `slots[k]` of
/// the replica's sharded slots.
struct UpdateTargets {
  const UntypedTensor* params_slice = nullptr;
  const std::vector<SlotTensors>* slots = nullptr;
};

/// The update segments of shard `me`: each variable's slice of the parameters (`s.params` of the
/// pack's `leaves`, or `targets.params_slice`), its gradient from `grad_slice` (shard `me`'s part
/// of the layout) and the replica's sharded slots (its slice of each, from their first element; or
/// `targets.slots`). Empty slices are left out.
std::vector<UpdateSegment> shard_update_segments(const ShardedPack& layout, const OptimizerStep& s,
                                                 const std::vector<std::size_t>& leaves, int64_t me,
                                                 const UntypedTensor& grad_slice, const UpdateTargets& targets = {});

/// Every shard's slices but `me`'s (every shard's for `me` < 0) copied from `gathered` (the whole
/// layout) into `params[k]`.
void unpack_shard_major(const ShardedPack& layout, const UntypedTensor& gathered, int64_t me,
                        const std::vector<const UntypedTensor*>& params);

}  // namespace mirrored::detail
