// The 64-bit FNV-1a hash of a string: a cheap, stable fingerprint (not a cryptographic one) that
// every worker computes alike, used to name shared memory after a job and to compare what
// workers passed without sending it whole.
#pragma once

#include <cstdint>
#include <string_view>

namespace mirrored::detail {

inline uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace mirrored::detail
