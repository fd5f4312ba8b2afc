#pragma once
/// \file
/// `Shape`: a tensor's dimensions.

#include <cstdint>
#include <vector>

namespace mirrored {

/// A tensor's dimensions, outermost first (empty for a rank-0 tensor).
using Shape = std::vector<int64_t>;

}  // namespace mirrored
