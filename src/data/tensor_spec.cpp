// TensorSpec's printed form (include/mirrored/data/tensor_spec.hpp).
#include "mirrored/data/tensor_spec.hpp"

#include <ostream>

namespace mirrored::data {

std::ostream& operator<<(std::ostream& os, const TensorSpec& s) {
  os << "TensorSpec(shape=";
  if (!s.known_rank) {
    os << "<unknown>";
  } else {
    os << "(";
    for (std::size_t i = 0; i < s.shape.size(); ++i) {
      if (i) os << ", ";
      if (s.shape[i] < 0)
        os << "None";
      else
        os << s.shape[i];
    }
    os << (s.shape.size() == 1 ? ",)" : ")");
  }
  return os << ", dtype=" << dtype_name(s.dtype) << ")";
}

}  // namespace mirrored::data
