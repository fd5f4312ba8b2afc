#pragma once
// Private: the all-reduces of the Gloo transport, on Gloo's point-to-point buffers: the ring (full
// precision) and the owner all-reduce (half-precision contributions, summed at once).
//
// Why not gloo::allreduce: with an input separate from the output (every all_reduce here: the
// result is a new tensor, the input stays), Gloo first copies the input into the output and then
// reduces into it, one extra pass over the whole buffer (about a fifth of a 64 MiB all-reduce
// between two processes on loopback). Here each received segment is added to the input straight
// into the output, and the first segments sent leave from the input itself.

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace mirrored::detail::cluster {

/// `out[i] = in[i] + (the other ranks' in[i])` over every rank of `context`; `in == out` is
/// allowed. `reduce(dst, own, incoming, elements)` computes `dst = own + incoming` (`dst` may be
/// `own`). Every rank receives bitwise the same result (each block is summed on one rank, then
/// passed on). `scratch` holds two segments (about 2 MiB), kept by the caller from one call to the
/// next (a fresh 2 MiB each time would be mapped and zeroed each time). `tag` must be the same on every rank and differ
/// between concurrent calls. \throws gloo's exceptions (a timeout says "Timed out") when a wait passes `deadline`.
void ring_all_reduce(gloo::Context& context, const void* in, void* out, std::size_t elements, std::size_t element_size,
                     const std::function<void(void*, const void*, const void*, std::size_t)>& reduce, uint32_t tag,
                     std::chrono::steady_clock::time_point deadline, std::vector<unsigned char>& scratch);

/// The element conversions of `owner_all_reduce`: what crosses is "wire" elements of `wire_size` bytes.
struct WireCodec {
  /// Writes this rank's contribution to elements [first, first + n) into `wire`.
  std::function<void(void* wire, std::size_t first, std::size_t n)> encode;
  /// `wire` = the combination of every rank's `n` wire elements, `parts` in rank order.
  std::function<void(void* wire, const void* const* parts, std::size_t n)> combine;
  /// Writes elements [first, first + n) of the result from their wire form.
  std::function<void(std::size_t first, const void* wire, std::size_t n)> decode;
};

/// All-reduce of `elements` elements in which each rank owns one block and combines every rank's
/// contribution to it at once, in rank order, then sends the result to every rank. Why not the
/// ring: a ring combines two contributions per hop, starting at a different rank for each block,
/// so half-precision partial sums would be rounded at every hop, in an order that depends on the
/// block (or cross as floats: twice the bytes). Here each contribution is encoded once, only wire
/// elements cross, each rank sends and receives (size - 1) / size of the buffer twice, as in the
/// ring, and every rank decodes the same bits. The blocks go in segments (up to 1 MiB, with at
/// most 24 MiB of scratch), each segment's contributions sent one segment ahead and its results
/// decoded one segment later, so that encoding, combining and decoding overlap the transfers.
/// Encoding reads an element before its result is decoded, so `encode` may read what `decode`
/// writes. `scratch`, `tag`, `deadline` and the exceptions as for ring_all_reduce.
void owner_all_reduce(gloo::Context& context, std::size_t elements, std::size_t wire_size, const WireCodec& codec,
                      uint32_t tag, std::chrono::steady_clock::time_point deadline,
                      std::vector<unsigned char>& scratch);

}  // namespace mirrored::detail::cluster
