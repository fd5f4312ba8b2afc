#pragma once
/// \file
/// Reduction operators for `reduce` and `all_reduce`.

#include <iosfwd>
#include <string_view>

namespace mirrored {

/// How values from replicas are combined.
enum class ReduceOp { SUM, MEAN };

/// Parses "SUM"/"MEAN" in any letter case. \throws InvalidArgumentError ("'MAX' is not a valid ReduceOp").
ReduceOp parse_reduce_op(std::string_view s);

/// "SUM" or "MEAN".
const char* reduce_op_name(ReduceOp op) noexcept;

/// Prints `ReduceOp.SUM` / `ReduceOp.MEAN`, as TF prints the enum.
std::ostream& operator<<(std::ostream& os, ReduceOp op);

}  // namespace mirrored
