#pragma once
/// \file
/// Options of cross-replica communication.

#include <cstdint>
#include <optional>

namespace mirrored {

/// Which collective implementation to prefer (a hint; AUTO lets the library choose).
enum class CommunicationImplementation { AUTO, RING, NCCL };

/// How float values cross between workers (beyond TF; PyTorch DDP's `fp16_compress_hook`,
/// Horovod's `Compression.fp16`). Only the bytes that cross workers (TCP, shared memory) are
/// compressed, which halves them for float32 (quarters them for float64): each worker's
/// contribution (its replicas' local sum) is rounded once to the half type (round to nearest even;
/// float64 through float, which rounds the same), the workers' contributions are summed in float
/// in worker order, and that sum is rounded once to the half type and widened exactly; every
/// worker gets the same bits. MEAN then divides by the number of replicas in the tensor's type, as
/// without compression. Integer-valued contributions and sums within the half type's consecutive
/// integers (|x| <= 2048 for FP16, <= 256 for BF16) are therefore exact. Only float32 and float64
/// tensors are compressed: integers cross exactly, and float16 and bfloat16 tensors cross as they
/// are (their sums, too, are added in float in worker order and rounded once). It applies to
/// `ReplicaContext::all_reduce`, `all_reduce_async`, `reduce_scatter`, `GradientBuckets` and the
/// optimizers' gradient all-reduce (`Optimizer::communication`); the in-process and NCCL paths,
/// and cross-replica reductions (`Strategy::reduce`, `batch_reduce_to`), ignore it.
enum class Compression {
  NONE,  ///< full precision (default)
  FP16,  ///< IEEE half: 11 significant bits; contributions and sums of magnitude 65520 and more
         ///< become infinity (65504 is the largest half)
  BF16,  ///< bfloat16: 8 significant bits, float32's range
};

/// "NONE", "FP16" or "BF16".
constexpr const char* compression_name(Compression c) noexcept {
  return c == Compression::FP16 ? "FP16" : c == Compression::BF16 ? "BF16" : "NONE";
}

/// Options of one collective call.
struct CommunicationOptions {
  /// Pack small tensors into buckets of at most this many bytes (0: one pack).
  int64_t bytes_per_pack = 0;
  /// Seconds a replica waits for the others in this collective before DeadlineExceededError.
  /// Unset: the strategy's default (`MIRRORED_COLLECTIVE_TIMEOUT_S`, 1800 s).
  std::optional<double> timeout_seconds = std::nullopt;
  /// Preferred implementation.
  CommunicationImplementation implementation = CommunicationImplementation::AUTO;
  /// Float values cross workers in this type (see Compression); every replica passes the same.
  Compression compression = Compression::NONE;
};

}  // namespace mirrored
