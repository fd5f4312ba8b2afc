#pragma once
/// \file
/// `float16` (IEEE 754 binary16) and `bfloat16` (the upper half of a binary32): 2-byte element
/// types for `Tensor<T>`, the storage types of TF's `tf.float16` and `tf.bfloat16`.
///
/// Both are trivially copyable structs holding the 16 bits; all arithmetic happens in `float`.
/// They convert implicitly to `float` (exactly: every half and bfloat16 value is a float), and
/// explicitly from `float`, rounding to nearest, ties to even:
/// - float16: finite values of magnitude >= 65520 (half-way past the largest finite, 65504)
///   become ±inf; values below 2^-14 become subnormals (multiples of 2^-24), the smallest
///   2^-24; magnitudes up to 2^-25 (a tie, rounded to the even 0) become ±0; the sign of zero is
///   kept. NaN stays NaN (quiet, the sign and the top 9 payload bits kept).
/// - bfloat16: the float's upper 16 bits after rounding on the lower 16; overflow past the
///   largest finite (3.3895e38) rounds to ±inf; NaN stays NaN (quiet).
/// Conversion from `double` or an integer goes through `float`: that double rounding gives the
/// correctly rounded result, because float carries at least 2p + 2 bits for both types' p.
/// Comparisons and arithmetic on the values go through `float` (so NaN != NaN, -0 == +0).

#include <bit>
#include <cstdint>

namespace mirrored {

namespace detail {

/// The binary16 bits nearest to `f` (ties to even).
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u)  // NaN: quiet, keeping the top payload bits
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 and inf
  if (abs >= 0x38800000u) {                                                   // >= 2^-14: normal
    // Round the 13 dropped bits to nearest even; a carry out of the mantissa bumps the exponent.
    const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
  }
  // Subnormal half: round(value / 2^-24) = round(m * 2^(e - 126)) for the float m * 2^(e - 150).
  const std::uint32_t e = abs >> 23;
  if (e == 0) return sign;  // float subnormals are far below 2^-25
  const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // >= 14 here
  if (shift > 24) return sign;           // below 2^-25
  std::uint32_t q = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // q == 1024 is the smallest normal, as it should be
  return static_cast<std::uint16_t>(sign | q);
}

/// The float equal to the binary16 `h` (NaN payloads kept).
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^10
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// The bfloat16 bits nearest to `f` (ties to even).
constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// The float equal to the bfloat16 `b`.
constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; finite range ±65504, smallest
/// normal 2^-14, smallest subnormal 2^-24. `float16{}` is +0.
struct float16 {
  float16() = default;
  /// `f` rounded to nearest, ties to even (see the file's notes for overflow, subnormals, NaN).
  constexpr explicit float16(float f) noexcept : bits_(detail::float_to_half_bits(f)) {}
  /// The exact value as a float.
  constexpr operator float() const noexcept { return detail::half_bits_to_float(bits_); }
  /// The value whose bit pattern is `bits`.
  static constexpr float16 from_bits(std::uint16_t bits) noexcept {
    float16 h;
    h.bits_ = bits;
    return h;
  }
  /// The bit pattern.
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_ = 0;
};

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (float's range at 8 bits of precision).
/// `bfloat16{}` is +0.
struct bfloat16 {
  bfloat16() = default;
  /// `f` rounded to nearest, ties to even; NaN stays NaN.
  constexpr explicit bfloat16(float f) noexcept : bits_(detail::float_to_bfloat16_bits(f)) {}
  /// The exact value as a float.
  constexpr operator float() const noexcept { return detail::bfloat16_bits_to_float(bits_); }
  /// The value whose bit pattern is `bits`.
  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 b;
    b.bits_ = bits;
    return b;
  }
  /// The bit pattern.
  constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_ = 0;
};

static_assert(sizeof(float16) == 2 && alignof(float16) == 2);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2);

}  // namespace mirrored
