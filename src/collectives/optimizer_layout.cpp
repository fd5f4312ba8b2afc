// The packs and the shard-major layout of an optimizer step (optimizer_layout.hpp).
#include "collectives/optimizer_layout.hpp"

#include <algorithm>
#include <utility>

#include "collectives/collective_helpers.hpp"
#include "mirrored/detail/balanced_split.hpp"

namespace mirrored::detail {

std::vector<Pack> optimizer_packs(const OptimizerStep& s) {
  std::vector<PackLeaf> leaves;
  for (const auto& p : s.params) leaves.push_back({s.dtype, p.device(), p.numel});
  PackRule rule;
  rule.bytes_per_pack = s.communication.bytes_per_pack;
  rule.one_leaf_each = !s.pack;
  rule.skip_empty = true;
  rule.max_leaves = kMaxUpdateSegments;
  return plan_packs(leaves, rule);
}

ShardedPack::ShardedPack(std::vector<int64_t> numel, int64_t num_shards)
    : numel_(std::move(numel)), shards_(num_shards) {
  split_.assign(static_cast<std::size_t>(shards_), 0);
  begin_.assign(static_cast<std::size_t>(shards_), 0);
  for (int64_t q = 0; q < shards_; ++q) {
    begin_[static_cast<std::size_t>(q)] = total_;
    for (const int64_t n : numel_) split_[static_cast<std::size_t>(q)] += balanced_piece(n, shards_, q).count;
    total_ += split_[static_cast<std::size_t>(q)];
  }
}

bool ShardedPack::equal_split() const noexcept {
  return std::all_of(split_.begin(), split_.end(), [&](int64_t c) { return c == split_.front(); });
}

ShardedPack::Piece ShardedPack::piece(int64_t q, std::size_t k) const noexcept {
  int64_t at = begin_[static_cast<std::size_t>(q)];
  for (std::size_t j = 0; j < k; ++j) at += balanced_piece(numel_[j], shards_, q).count;
  const auto p = balanced_piece(numel_[k], shards_, q);
  return {p.begin, at, p.count};
}

ShardedPack sharded_pack(const OptimizerStep& s, const Pack& pack, int64_t num_shards) {
  std::vector<int64_t> numel;
  numel.reserve(pack.leaves.size());
  for (std::size_t v : pack.leaves) numel.push_back(s.params[v].numel);
  return ShardedPack(std::move(numel), num_shards);
}

UntypedTensor pack_shard_major(const ShardedPack& layout, const std::vector<const UntypedTensor*>& whole, int64_t only,
                               DType dtype, const Device& device) {
  const std::size_t elem = dtype_size(dtype);
  const int64_t numel = only >= 0 ? layout.split()[static_cast<std::size_t>(only)] : layout.numel();
  UntypedTensor out = make_untyped(dtype, {numel}, device);
  const int64_t base = only >= 0 ? layout.shard_begin(only) : 0;
  for (int64_t q = 0; q < layout.num_shards(); ++q) {
    if (only >= 0 && q != only) continue;
    for (std::size_t k = 0; k < layout.num_variables(); ++k) {
      const auto p = layout.piece(q, k);
      if (p.count)
        copy_between(element_at(out, p.in_layout - base), device, element_at(*whole[k], p.in_variable),
                     whole[k]->device(), static_cast<std::size_t>(p.count) * elem);
    }
  }
  return out;
}

std::vector<UpdateSegment> shard_update_segments(const ShardedPack& layout, const OptimizerStep& s,
                                                 const std::vector<std::size_t>& leaves, int64_t me,
                                                 const UntypedTensor& grad_slice, const UpdateTargets& targets) {
  std::vector<UpdateSegment> segments;
  const int64_t base = layout.shard_begin(me);
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    const std::size_t v = leaves[k];
    const auto p = layout.piece(me, k);
    if (!p.count) continue;
    UpdateSegment seg;
    seg.param = targets.params_slice ? element_at(*targets.params_slice, p.in_layout - base)
                                     : element_at(s.params[v], p.in_variable);
    seg.grad = element_at(grad_slice, p.in_layout - base);
    seg.count = p.count;
    for (std::size_t j = 0; j < s.slots[v].size(); ++j) {
      const UntypedTensor& slot = targets.slots ? (*targets.slots)[k][j] : s.slots[v][j];
      seg.slot[j] = slot.storage ? slot.data() : nullptr;
    }
    segments.push_back(seg);
  }
  return segments;
}

void unpack_shard_major(const ShardedPack& layout, const UntypedTensor& gathered, int64_t me,
                        const std::vector<const UntypedTensor*>& params) {
  const std::size_t elem = dtype_size(gathered.dtype);
  for (int64_t q = 0; q < layout.num_shards(); ++q) {
    if (q == me) continue;
    for (std::size_t k = 0; k < layout.num_variables(); ++k) {
      const auto p = layout.piece(q, k);
      if (p.count)
        copy_between(element_at(*params[k], p.in_variable), params[k]->device(), element_at(gathered, p.in_layout),
                     gathered.device(), static_cast<std::size_t>(p.count) * elem);
    }
  }
}

}  // namespace mirrored::detail
