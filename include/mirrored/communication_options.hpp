#pragma once
/// \file
/// Options of cross-replica communication.

#include <cstdint>
#include <optional>

namespace mirrored {

/// Which collective implementation to prefer (a hint; AUTO lets the library choose).
enum class CommunicationImplementation { AUTO, RING, NCCL };

/// Options of one collective call.
struct CommunicationOptions {
  /// Pack small tensors into buckets of at most this many bytes (0: one pack).
  int64_t bytes_per_pack = 0;
  /// Seconds a replica waits for the others in this collective before DeadlineExceededError.
  /// Unset: the strategy's default (`MIRRORED_COLLECTIVE_TIMEOUT_S`, 1800 s).
  std::optional<double> timeout_seconds = std::nullopt;
  /// Preferred implementation.
  CommunicationImplementation implementation = CommunicationImplementation::AUTO;
};

}  // namespace mirrored
