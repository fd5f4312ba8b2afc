#pragma once
// Private: the ring all-reduce of the Gloo transport, on Gloo's point-to-point buffers.
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

}  // namespace mirrored::detail::cluster
