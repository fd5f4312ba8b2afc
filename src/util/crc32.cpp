// CRC-32 with zlib's polynomial and conventions, by carry-less-multiplication folding.
//
// The mathematics. zlib's CRC-32 is the "reflected" CRC with the generator
//   P(x) = x^32 + x^26 + x^23 + x^22 + x^16 + x^12 + x^11 + x^10 + x^8 + x^7 + x^5 + x^4 + x^2 + x + 1:
// the message is the polynomial M(x) over GF(2) whose highest power is the least significant bit of
// the first byte, and the CRC register after M, starting from register I, is
//   (I(x)·x^|M| + M(x)·x^32) mod P(x),
// which is M'(x)·x^32 mod P for M' = M with I added to its first 32 bits. zlib's `crc32(crc, ...)`
// starts from the register ~crc and returns ~register.
//
// Only M' mod P matters, so long messages are first folded, with carry-less multiplication, into a
// 128-bit polynomial S congruent to M' mod P, and only S goes through the slow final reduction.
//
// Loaded little-endian into a 128-bit register, 16 message bytes put the coefficient of x^(127-k) at
// bit k: the low 64 bits hold H and the high 64 bits L of the block H(x)·x^64 + L(x), each with the
// coefficient of x^(63-i) at bit i. Moving a block D bits further along the message multiplies it by
// x^D: S·x^D = H·x^(64+D) + L·x^D ≡ H·(x^(64+D) mod P) + L·(x^D mod P). PCLMULQDQ multiplies a
// 64-bit operand with x^(63-i) at bit i by a 32-bit constant with x^(31-j) at bit j into bits that
// stand for x^(94-k), i.e. read as a 128-bit block (x^(127-k) at bit k) it yields the product times
// x^33. The constants are therefore x^(D+31) mod P for H and x^(D-33) mod P for L, bit-reversed into
// 32 bits; both products have degree below 127 and fit a block. Folding adds (XORs) the moved block
// into the block D bits later. Several blocks side by side (4 × 128 bits for PCLMULQDQ, 16 × 128
// bits in four 512-bit registers for VPCLMULQDQ) each move by the width of the whole group, then
// are moved onto the last one with smaller distances.
//
// At the end, M'·x^32 mod P = S·x^32 mod P is the register that a byte-at-a-time table gives for the
// 16 bytes of S from a zero register; the table then takes the last (< 16) bytes. Inputs too short
// to fold (< 64 bytes) go through the table alone: at most ~80 table steps per call. Without
// PCLMULQDQ (checked at run time), and in builds for other architectures, zlib's crc32 does it all.

#include "util/crc32.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>

#if defined(__x86_64__)
#include <immintrin.h>
#define MIRRORED_CRC32_X86 1
#else
#define MIRRORED_CRC32_X86 0
#endif

namespace mirrored::detail {
namespace {

// --- GF(2) polynomial arithmetic, at compile time -------------------------------------------

/// P(x) without its x^32 term, with the coefficient of x^d at bit d.
constexpr std::uint32_t kPoly = 0x04C11DB7u;

/// x^n mod P(x), with the coefficient of x^d at bit d.
constexpr std::uint32_t xn_mod_p(unsigned n) {
  std::uint32_t r = 1;  // x^0
  // r·x; when that makes an x^32 term, subtracting (XOR) P removes it.
  for (unsigned i = 0; i < n; ++i) r = (r << 1) ^ ((r & 0x80000000u) != 0 ? kPoly : 0u);
  return r;
}

/// A polynomial of degree < 32 with its bits reversed (x^(31-j) at bit j): the order of the reflected
/// CRC, which takes the least significant bit of a byte as its highest power.
constexpr std::uint32_t reflect32(std::uint32_t v) {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

constexpr std::uint32_t kPolyReflected = reflect32(kPoly);
static_assert(kPolyReflected == 0xEDB88320u, "zlib's polynomial, as zlib writes it");
static_assert(xn_mod_p(32) == kPoly && xn_mod_p(31) == 0x80000000u);

std::uint32_t crc32_zlib(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  // zlib takes a uInt length: feed it in pieces that fit.
  constexpr std::size_t kMaxPiece = std::size_t{1} << 30;
  uLong c = crc;
  while (n > 0) {
    const std::size_t piece = std::min(n, kMaxPiece);
    c = ::crc32(c, p, static_cast<uInt>(piece));
    p += piece;
    n -= piece;
  }
  return static_cast<std::uint32_t>(c);
}

#if MIRRORED_CRC32_X86

/// Entry b: the register after shifting byte b through a zero register (b(x)·x^32 mod P, reflected).
constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t r = b;
    for (int k = 0; k < 8; ++k) r = (r >> 1) ^ ((r & 1u) != 0 ? kPolyReflected : 0u);
    table[b] = r;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kTable = make_table();

/// The register (not inverted) after `n` more bytes, one table step per byte.
std::uint32_t table_update(std::uint32_t reg, const unsigned char* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) reg = kTable[(reg ^ p[i]) & 0xFFu] ^ (reg >> 8);
  return reg;
}

std::uint32_t crc32_table(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  return ~table_update(~crc, p, n);
}

/// The multipliers that move a 128-bit block `distance` bits along the message (see the top of the
/// file): `high` for its first 64 bits (H), `low` for its last 64 (L).
struct FoldConstants {
  std::uint64_t high, low;
};

constexpr FoldConstants fold_constants(unsigned distance) {
  return {reflect32(xn_mod_p(distance + 31)), reflect32(xn_mod_p(distance - 33))};
}

constexpr FoldConstants kFold128 = fold_constants(128);  // one 16-byte block
constexpr FoldConstants kFold256 = fold_constants(256);
constexpr FoldConstants kFold384 = fold_constants(384);
constexpr FoldConstants kFold512 = fold_constants(512);  // four blocks, one 512-bit register
constexpr FoldConstants kFold1024 = fold_constants(1024);
constexpr FoldConstants kFold1536 = fold_constants(1536);
constexpr FoldConstants kFold2048 = fold_constants(2048);  // four 512-bit registers

// Compiled for CPUs with PCLMULQDQ (the caller checks at run time), whatever the build's -march.
#define MIRRORED_TARGET_PCLMUL __attribute__((target("pclmul")))
#define MIRRORED_TARGET_VPCLMUL512 __attribute__((target("pclmul,avx512f,vpclmulqdq")))

MIRRORED_TARGET_PCLMUL inline __m128i multiplier(FoldConstants k) {
  return _mm_set_epi64x(static_cast<long long>(k.low), static_cast<long long>(k.high));
}

MIRRORED_TARGET_PCLMUL inline __m128i load16(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

/// `s` moved along by the distance of `k`, plus `next`.
MIRRORED_TARGET_PCLMUL inline __m128i fold(__m128i s, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(s, k, 0x00), _mm_clmulepi64_si128(s, k, 0x11)), next);
}

/// The register after the 128-bit remainder `s` and then `n` bytes at `p`: folds whole blocks into
/// `s`, then reduces it with the table (S·x^32 mod P, see the top of the file).
MIRRORED_TARGET_PCLMUL std::uint32_t fold_blocks_and_finish(__m128i s, const unsigned char* p, std::size_t n) {
  const __m128i k128 = multiplier(kFold128);
  for (; n >= 16; p += 16, n -= 16) s = fold(s, k128, load16(p));
  alignas(16) unsigned char block[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(block), s);
  return table_update(table_update(0, block, 16), p, n);
}

/// Four blocks, in message order, folded onto the last.
MIRRORED_TARGET_PCLMUL inline __m128i fold4(__m128i x0, __m128i x1, __m128i x2, __m128i x3) {
  __m128i s = fold(x2, multiplier(kFold128), x3);
  s = fold(x1, multiplier(kFold256), s);
  return fold(x0, multiplier(kFold384), s);
}

MIRRORED_TARGET_PCLMUL std::uint32_t crc32_pclmul(std::uint32_t crc, const unsigned char* p, std::size_t n) noexcept {
  if (n < 64) return crc32_table(crc, p, n);
  // The initial register goes into the message's first 32 bits (the low 32 bits of the first block).
  __m128i x0 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load16(p + 16);
  __m128i x2 = load16(p + 32);
  __m128i x3 = load16(p + 48);
  p += 64;
  n -= 64;
  const __m128i k512 = multiplier(kFold512);
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k512, load16(p));
    x1 = fold(x1, k512, load16(p + 16));
    x2 = fold(x2, k512, load16(p + 32));
    x3 = fold(x3, k512, load16(p + 48));
  }
  return ~fold_blocks_and_finish(fold4(x0, x1, x2, x3), p, n);
}

MIRRORED_TARGET_VPCLMUL512 inline __m512i multiplier512(FoldConstants k) {
  // The same pair in every 128-bit lane. (Not _mm512_broadcast_i32x4: GCC 12 warns about the
  // undefined vector inside it, as it does for _mm512_extracti32x4_epi32.)
  const auto high = static_cast<long long>(k.high), low = static_cast<long long>(k.low);
  return _mm512_set_epi64(low, high, low, high, low, high, low, high);
}

MIRRORED_TARGET_VPCLMUL512 inline __m512i load64(const unsigned char* p) { return _mm512_loadu_si512(p); }

/// Each of the four blocks of `s` moved along by the distance of `k`, plus `next`.
MIRRORED_TARGET_VPCLMUL512 inline __m512i fold512(__m512i s, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(s, k, 0x00), _mm512_clmulepi64_epi128(s, k, 0x11), next,
                                   0x96);  // 0x96: a ^ b ^ c
}

MIRRORED_TARGET_VPCLMUL512 std::uint32_t crc32_vpclmul512(std::uint32_t crc, const unsigned char* p,
                                                          std::size_t n) noexcept {
  if (n < 256) return crc32_pclmul(crc, p, n);
  const __m128i init = _mm_cvtsi32_si128(static_cast<int>(~crc));
  __m512i z0 = _mm512_xor_si512(load64(p), _mm512_inserti32x4(_mm512_setzero_si512(), init, 0));
  __m512i z1 = load64(p + 64);
  __m512i z2 = load64(p + 128);
  __m512i z3 = load64(p + 192);
  p += 256;
  n -= 256;
  const __m512i k2048 = multiplier512(kFold2048);
  for (; n >= 256; p += 256, n -= 256) {
    z0 = fold512(z0, k2048, load64(p));
    z1 = fold512(z1, k2048, load64(p + 64));
    z2 = fold512(z2, k2048, load64(p + 128));
    z3 = fold512(z3, k2048, load64(p + 192));
  }
  // Each block of z0 lies 3 × 512 bits before the block of z3 in the same lane, and so on.
  __m512i z = fold512(z0, multiplier512(kFold1536), z3);
  z = fold512(z1, multiplier512(kFold1024), z);
  z = fold512(z2, multiplier512(kFold512), z);
  const __m512i k512 = multiplier512(kFold512);
  for (; n >= 64; p += 64, n -= 64) z = fold512(z, k512, load64(p));
  alignas(64) unsigned char lanes[64];
  _mm512_store_si512(lanes, z);
  const __m128i s = fold4(load16(lanes), load16(lanes + 16), load16(lanes + 32), load16(lanes + 48));
  return ~fold_blocks_and_finish(s, p, n);
}

bool cpu_has_pclmul() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul");
}

bool cpu_has_vpclmul512() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
}

#endif  // MIRRORED_CRC32_X86

Crc32Kernel fastest_kernel() noexcept {
  if (crc32_kernel_supported(Crc32Kernel::kVpclmul512)) return Crc32Kernel::kVpclmul512;
  if (crc32_kernel_supported(Crc32Kernel::kPclmul)) return Crc32Kernel::kPclmul;
  return Crc32Kernel::kZlib;
}

std::atomic<Crc32Kernel>& active_kernel() noexcept {
  static std::atomic<Crc32Kernel> kernel{fastest_kernel()};
  return kernel;
}

}  // namespace

const char* crc32_kernel_name(Crc32Kernel kernel) noexcept {
  switch (kernel) {
    case Crc32Kernel::kZlib: return "zlib";
    case Crc32Kernel::kPclmul: return "pclmul";
    case Crc32Kernel::kVpclmul512: return "vpclmul512";
  }
  return "?";
}

bool crc32_kernel_supported(Crc32Kernel kernel) noexcept {
  switch (kernel) {
    case Crc32Kernel::kZlib: return true;
#if MIRRORED_CRC32_X86
    case Crc32Kernel::kPclmul: {
      static const bool has = cpu_has_pclmul();
      return has;
    }
    case Crc32Kernel::kVpclmul512: {
      static const bool has = cpu_has_vpclmul512();
      return has;
    }
#else
    case Crc32Kernel::kPclmul:
    case Crc32Kernel::kVpclmul512: return false;
#endif
  }
  return false;
}

Crc32Kernel crc32_kernel() noexcept { return active_kernel().load(std::memory_order_relaxed); }

bool set_crc32_kernel(Crc32Kernel kernel) noexcept {
  if (!crc32_kernel_supported(kernel)) return false;
  active_kernel().store(kernel, std::memory_order_relaxed);
  return true;
}

std::uint32_t crc32_update(Crc32Kernel kernel, std::uint32_t crc, const void* data, std::size_t bytes) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  if (!crc32_kernel_supported(kernel)) kernel = Crc32Kernel::kZlib;  // never an illegal instruction
  switch (kernel) {
#if MIRRORED_CRC32_X86
    case Crc32Kernel::kPclmul: return crc32_pclmul(crc, p, bytes);
    case Crc32Kernel::kVpclmul512: return crc32_vpclmul512(crc, p, bytes);
#else
    case Crc32Kernel::kPclmul:
    case Crc32Kernel::kVpclmul512:
#endif
    case Crc32Kernel::kZlib: break;
  }
  return crc32_zlib(crc, p, bytes);
}

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t bytes) noexcept {
  return crc32_update(crc32_kernel(), crc, data, bytes);
}

}  // namespace mirrored::detail
