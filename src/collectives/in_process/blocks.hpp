#pragma once
// Private: how InProcessAllReduce walks memory, for its all-reduce and its optimizer step alike.

#include <cstddef>

namespace mirrored::detail::in_process {

/// Blocks small enough that a block's sum is still in cache when it is copied to the other
/// replicas (or updates the parameters).
inline constexpr std::size_t kBlockBytes = 16384;
/// Per replica and collective: at this size the N outputs no longer fit a typical last-level
/// cache share, so caching them on the way out only costs bandwidth; they are written with
/// streaming stores instead.
inline constexpr std::size_t kStreamMinBytes = std::size_t{8} << 20;

}  // namespace mirrored::detail::in_process
