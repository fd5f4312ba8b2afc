#pragma once
/// \file
/// Packing many tensors into few collectives (TF's greedy `group_by_size`).

#include <cstdint>
#include <vector>

#include "mirrored/detail/untyped_tensor.hpp"

namespace mirrored::detail {

/// Splits `leaves` (indices in order) into packs reduced as one: a new pack starts when the
/// current one already exceeds `bytes_per_pack` bytes (0: no limit), or when the dtype or device
/// changes (a pack is reduced as one contiguous run of elements of one dtype).
std::vector<std::vector<std::size_t>> plan_packs(const std::vector<UntypedTensor>& leaves, int64_t bytes_per_pack);

}  // namespace mirrored::detail
