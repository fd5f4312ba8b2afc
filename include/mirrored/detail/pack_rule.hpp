#pragma once
/// \file
/// Needed by `GradientBuckets` (gradient_buckets.hpp), which closes its buckets as gradients
/// arrive: the rule by which every pack of the library is full, shared with the planner of the
/// collectives (src/collectives/packing.hpp, which also packs the optimizers' fused updates), so
/// that a bucket, an update pack and a planned pack of the same tensors end at the same tensor.

#include <cstdint>

namespace mirrored::detail {

/// True when a pack holding `bytes` is full under `CommunicationOptions::bytes_per_pack` (0: no
/// limit, never full): the next tensor starts a new pack. A pack is never split, so it may end past
/// the limit by its last tensor (few large packs, as TF's `group_by_size`).
constexpr bool pack_is_full(int64_t bytes, int64_t bytes_per_pack) noexcept {
  return bytes_per_pack > 0 && bytes >= bytes_per_pack;
}

}  // namespace mirrored::detail
