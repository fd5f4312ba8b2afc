#include "device/host/host_half.hpp"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define MIRRORED_HOST_F16C 1
#endif

namespace mirrored::detail {

#ifdef MIRRORED_HOST_F16C

namespace {

#define MIRRORED_F16C_TARGET __attribute__((target("avx2,f16c")))

// Eight float16 (as bits) to floats. vcvtph2ps sets the quiet bit of a signaling NaN, which
// half_bits_to_float keeps clear: clear it again for those lanes.
MIRRORED_F16C_TARGET inline __m256 widen8(__m128i halves) {
  const __m256i bits = _mm256_cvtepu16_epi32(halves);
  const __m256i nan_top = _mm256_and_si256(bits, _mm256_set1_epi32(0x7e00));
  const __m256i payload = _mm256_and_si256(bits, _mm256_set1_epi32(0x01ff));
  const __m256i signaling = _mm256_andnot_si256(_mm256_cmpeq_epi32(payload, _mm256_setzero_si256()),
                                                _mm256_cmpeq_epi32(nan_top, _mm256_set1_epi32(0x7c00)));
  const __m256i wide = _mm256_castps_si256(_mm256_cvtph_ps(halves));
  return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(signaling, _mm256_set1_epi32(0x00400000)), wide));
}

// Eight floats to float16 bits, to nearest even (the immediate, not MXCSR's rounding mode).
MIRRORED_F16C_TARGET inline __m128i narrow8(__m256 floats) {
  return _mm256_cvtps_ph(floats, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

MIRRORED_F16C_TARGET inline __m128i load8(const float16* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
MIRRORED_F16C_TARGET inline void store8(float16* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

// Eight float16 from `p`, of which only the first `n` (< 8) exist: the last count % 8 elements of
// a buffer go through the same instructions as the others.
MIRRORED_F16C_TARGET inline __m128i load_tail(const float16* p, std::size_t n) {
  float16 tail[8] = {};
  std::memcpy(tail, p, n * sizeof(float16));
  return load8(tail);
}
MIRRORED_F16C_TARGET inline void store_tail(float16* p, std::size_t n, __m128i v) {
  float16 tail[8];
  store8(tail, v);
  std::memcpy(p, tail, n * sizeof(float16));
}

}  // namespace

bool host_has_f16c() noexcept {
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  // AVX2's check includes the operating system's support for the AVX registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  }();
  return has;
}

MIRRORED_F16C_TARGET void f16c_narrow(const float* in, float16* out, int64_t count) noexcept {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) store8(out + i, narrow8(_mm256_loadu_ps(in + i)));
  if (i == count) return;
  const auto rest = static_cast<std::size_t>(count - i);
  float tail[8] = {};
  std::memcpy(tail, in + i, rest * sizeof(float));
  store_tail(out + i, rest, narrow8(_mm256_loadu_ps(tail)));
}

MIRRORED_F16C_TARGET void f16c_widen(const float16* in, float* out, int64_t count) noexcept {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, widen8(load8(in + i)));
  if (i == count) return;
  const auto rest = static_cast<std::size_t>(count - i);
  float tail[8];
  _mm256_storeu_ps(tail, widen8(load_tail(in + i, rest)));
  std::memcpy(out + i, tail, rest * sizeof(float));
}

MIRRORED_F16C_TARGET void f16c_sum(const float16* const* inputs, int num_inputs, float16* out, int64_t count,
                                   int64_t mean_divisor) noexcept {
  const __m256 divisor = _mm256_set1_ps(static_cast<float>(mean_divisor));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 acc = widen8(load8(inputs[0] + i));
    for (int k = 1; k < num_inputs; ++k) acc = _mm256_add_ps(acc, widen8(load8(inputs[k] + i)));
    if (mean_divisor > 0) acc = _mm256_div_ps(acc, divisor);
    store8(out + i, narrow8(acc));
  }
  if (i == count) return;
  const auto rest = static_cast<std::size_t>(count - i);
  __m256 acc = widen8(load_tail(inputs[0] + i, rest));
  for (int k = 1; k < num_inputs; ++k) acc = _mm256_add_ps(acc, widen8(load_tail(inputs[k] + i, rest)));
  if (mean_divisor > 0) acc = _mm256_div_ps(acc, divisor);
  store_tail(out + i, rest, narrow8(acc));
}

#else  // not x86-64: the host backend's portable loops do the work

bool host_has_f16c() noexcept { return false; }
void f16c_narrow(const float*, float16*, int64_t) noexcept {}
void f16c_widen(const float16*, float*, int64_t) noexcept {}
void f16c_sum(const float16* const*, int, float16*, int64_t, int64_t) noexcept {}

#endif

}  // namespace mirrored::detail
