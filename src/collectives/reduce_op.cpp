#include "mirrored/reduce_op.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "mirrored/errors.hpp"

namespace mirrored {

ReduceOp parse_reduce_op(std::string_view s) {
  std::string upper(s);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  if (upper == "SUM") return ReduceOp::SUM;
  if (upper == "MEAN") return ReduceOp::MEAN;
  // TF parses ReduceOp(name.upper()), so its message shows the upper-cased name.
  throw InvalidArgumentError("'" + upper + "' is not a valid ReduceOp");
}

const char* reduce_op_name(ReduceOp op) noexcept { return op == ReduceOp::SUM ? "SUM" : "MEAN"; }

std::ostream& operator<<(std::ostream& os, ReduceOp op) { return os << "ReduceOp." << reduce_op_name(op); }

}  // namespace mirrored
