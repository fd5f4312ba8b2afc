#pragma once
/// \file
/// The BALANCED rule (docs/api.md §9) as one function: how `total` items are cut into `parts` consecutive
/// pieces whose sizes differ by at most one, the first `total - parts * floor(total / parts)`
/// pieces getting one more. Needed by `ReplicaContext::reduce_scatter`'s callers and by the
/// optimizers' sharded state (<mirrored/optimizers.hpp>: every replica's slice of each variable).

#include <cstdint>

namespace mirrored::detail {

/// One piece of a balanced cut: items [begin, begin + count).
struct BalancedPiece {
  int64_t begin = 0;
  int64_t count = 0;
};

/// Piece `index` (0 <= index < parts) of `total` items cut into `parts` by the BALANCED rule.
constexpr BalancedPiece balanced_piece(int64_t total, int64_t parts, int64_t index) noexcept {
  const int64_t floor = total / parts;
  const int64_t extra = total - floor * parts;
  const int64_t begin = index * floor + (index < extra ? index : extra);
  return {begin, floor + (index < extra ? 1 : 0)};
}

}  // namespace mirrored::detail
