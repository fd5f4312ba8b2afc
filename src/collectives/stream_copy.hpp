#pragma once
// Private: a copy that writes around the cache (non-temporal stores), for results too large to
// stay cached anyway. A plain store first reads the destination line into the cache
// (write-allocate), so writing S fresh bytes moves 2·S through memory; streaming stores move S.

#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mirrored::detail {

/// Per replica and collective: at this size the results no longer fit a typical last-level cache
/// share, so caching them on the way out only costs bandwidth; they are written with streaming
/// stores instead.
inline constexpr std::size_t kStreamMinBytes = std::size_t{8} << 20;

/// Copies `bytes` from `src` to `dst`, the 16-byte-aligned body with streaming stores where the
/// CPU has them (memcpy elsewhere). Call `stream_fence()` before another thread reads `dst`.
inline void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  if (head >= bytes) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const std::size_t body = bytes & ~std::size_t{63};
  for (std::size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Orders earlier streaming stores before later stores (they are weakly ordered on x86).
inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace mirrored::detail
