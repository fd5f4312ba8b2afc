#pragma once
// Private: reading the structure encodings of detail::flatten (include/mirrored/detail/nest.hpp)
// back, to say where two replicas' nests differ.
#include <string>
#include <string_view>

namespace mirrored::detail {

/// The message for two replicas whose nests have different structures (`a` of replica
/// `replica_a`, `b` of replica `replica_b`, both encoded by `flatten`, `a != b`): names `op`,
/// both replicas and what each passed at the first place where the nests differ, e.g.
/// `all_reduce: replica 0 passed keys {"a,b", "c"} but replica 1 passed keys {"a", "b,c"}` or
/// `reduce: replica 0 passed a vector of 2 elements but replica 2 passed a vector of 3 elements at
/// ["w"][1]`. \throws InternalError for an encoding `flatten` cannot have made.
std::string structure_mismatch(const char* op, int replica_a, std::string_view a, int replica_b, std::string_view b);

}  // namespace mirrored::detail
