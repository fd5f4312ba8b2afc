#include "collectives/packing.hpp"

#include "util/exceptions.hpp"

namespace mirrored::detail {

std::vector<Pack> plan_packs(const std::vector<PackLeaf>& leaves, const PackRule& rule) {
  MIRRORED_ENFORCE(rule.chunks >= 1, InvalidArgumentError, "plan_packs: chunks must be >= 1, got ", rule.chunks);
  MIRRORED_ENFORCE(rule.bytes_per_pack >= 0, InvalidArgumentError, "plan_packs: bytes_per_pack must be >= 0, got ",
                   rule.bytes_per_pack);
  std::vector<Pack> packs;
  int64_t open_bytes = 0;
  const PackLeaf* open = nullptr;  // the first leaf of the open pack
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const PackLeaf& leaf = leaves[i];
    if (rule.skip_empty && leaf.numel <= 0) continue;
    const bool same_kind = open && open->dtype == leaf.dtype && open->device == leaf.device;
    const bool crowded = rule.max_leaves > 0 && !packs.empty() &&
                         packs.back().leaves.size() >= static_cast<std::size_t>(rule.max_leaves);
    if (!same_kind || rule.one_leaf_each || crowded || pack_is_full(open_bytes, rule.bytes_per_pack)) {
      packs.emplace_back();
      open = &leaf;
      open_bytes = 0;
    }
    packs.back().leaves.push_back(i);
    packs.back().numel += leaf.numel;
    open_bytes += leaf.numel * static_cast<int64_t>(dtype_size(leaf.dtype));
  }
  for (Pack& p : packs) {
    const int64_t base = p.numel / rule.chunks, extra = p.numel % rule.chunks;
    int64_t at = 0;
    for (int c = 0; c < rule.chunks; ++c) {
      const int64_t len = base + (c < extra ? 1 : 0);
      if (len > 0 || (c == 0 && p.numel == 0)) p.chunks.emplace_back(at, at + len);
      at += len;
    }
  }
  return packs;
}

PackRule nccl_pack_rule(int num_packs, int64_t bytes_per_pack) {
  PackRule rule;
  rule.bytes_per_pack = bytes_per_pack;
  rule.one_leaf_each = num_packs == 0;
  rule.skip_empty = true;
  rule.chunks = num_packs == 0 ? 1 : num_packs;
  return rule;
}

std::vector<std::vector<std::size_t>> plan_packs(const std::vector<UntypedTensor>& tensors, int64_t bytes_per_pack) {
  std::vector<PackLeaf> leaves;
  leaves.reserve(tensors.size());
  for (const auto& t : tensors) leaves.push_back({t.dtype, t.device(), t.numel});
  PackRule rule;
  rule.bytes_per_pack = bytes_per_pack;
  std::vector<std::vector<std::size_t>> out;
  for (Pack& p : plan_packs(leaves, rule)) out.push_back(std::move(p.leaves));
  return out;
}

}  // namespace mirrored::detail
