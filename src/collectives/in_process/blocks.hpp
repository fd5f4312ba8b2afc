#pragma once
// Private: how InProcessAllReduce walks memory, for its all-reduce and its optimizer step alike.

#include <cstddef>

namespace mirrored::detail::in_process {

/// Blocks small enough that a block's sum is still in cache when it is copied to the other
/// replicas (or updates the parameters).
inline constexpr std::size_t kBlockBytes = 16384;

}  // namespace mirrored::detail::in_process
