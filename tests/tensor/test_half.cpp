// float16 and bfloat16: conversions against a reference table and an independent nearest-value
// search, every bit pattern round-tripped, element-wise ops, casts and printing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <type_traits>
#include <vector>

#include "mirrored/half.hpp"
#include "mirrored/nn.hpp"
#include "mirrored/repr.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {
namespace {

static_assert(std::is_trivially_copyable_v<float16> && sizeof(float16) == 2);
static_assert(std::is_trivially_copyable_v<bfloat16> && sizeof(bfloat16) == 2);
static_assert(is_tensor_element_v<float16> && is_tensor_element_v<bfloat16>);
static_assert(dtype_of<float16>() == DType::float16 && dtype_of<bfloat16>() == DType::bfloat16);
static_assert(dtype_is_floating(DType::float16) && dtype_is_floating(DType::bfloat16));
static_assert(float16(1.0f).bits() == 0x3c00 && bfloat16(1.0f).bits() == 0x3f80);  // usable in constant expressions

float f32(std::uint32_t bits) { return std::bit_cast<float>(bits); }

struct Row {
  float in;
  std::uint16_t want;
};

TEST(Float16, FromFloatMatchesTheReferenceTable) {
  const float two_m24 = std::ldexp(1.0f, -24), two_m25 = std::ldexp(1.0f, -25), two_m14 = std::ldexp(1.0f, -14);
  const Row rows[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.5f, 0x3800},
      {0.1f, 0x2e66},
      {1.0f / 3.0f, 0x3555},
      {65504.0f, 0x7bff},                        // largest finite
      {std::nextafter(65520.0f, 0.0f), 0x7bff},  // just below the half-way point
      {65520.0f, 0x7c00},                        // half-way: ties to even overflows to inf
      {-65520.0f, 0xfc00},                       //
      {1e10f, 0x7c00},                           //
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {-std::numeric_limits<float>::infinity(), 0xfc00},
      {two_m14, 0x0400},                        // smallest normal
      {two_m14 - two_m25, 0x0400},              // tie between 0x03ff and 0x0400: even
      {two_m14 - 3 * two_m25, 0x03fe},          // tie between 0x03fe and 0x03ff: even
      {two_m24, 0x0001},                        // smallest subnormal
      {-two_m24, 0x8001},                       //
      {two_m25, 0x0000},                        // tie between 0 and 2^-24: even
      {std::nextafter(two_m25, 1.0f), 0x0001},  // just above the tie
      {-two_m25, 0x8000},                       // the sign of zero is kept
      {3 * two_m25, 0x0002},                    // tie between 1 and 2 ulps: even
      {1023 * two_m24, 0x03ff},                 // largest subnormal
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},      // tie: even
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},  // tie: even (up)
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3c01},
      {2049.0f, 0x6800},  // integers above 2048 step by 2: tie to even
      {2051.0f, 0x6802},
      {-2050.0f, 0xe801},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(float16(r.in).bits(), r.want) << "float16(" << r.in << ")";
    // Double and integer inputs go through float, which rounds them first.
  }
  EXPECT_EQ(static_cast<float16>(2049.0).bits(), 0x6800);
  EXPECT_EQ(static_cast<float16>(int64_t{2051}).bits(), 0x6802);
}

TEST(Float16, ToFloatMatchesTheReferenceTable) {
  EXPECT_EQ(float(float16::from_bits(0x7bff)), 65504.0f);
  EXPECT_EQ(float(float16::from_bits(0xfbff)), -65504.0f);
  EXPECT_EQ(float(float16::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(float(float16::from_bits(0x03ff)), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(float(float16::from_bits(0x0400)), std::ldexp(1.0f, -14));
  EXPECT_EQ(float(float16::from_bits(0x3555)), 0.333251953125f);
  EXPECT_EQ(float(float16::from_bits(0x3c01)), 1.0009765625f);
  EXPECT_EQ(float(float16::from_bits(0x7c00)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(float(float16::from_bits(0xfc00)), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(float(float16::from_bits(0x8000))), 0x80000000u);  // -0
  EXPECT_EQ(std::bit_cast<std::uint32_t>(float(float16::from_bits(0x0000))), 0u);
  EXPECT_TRUE(std::isnan(float(float16::from_bits(0x7e00))));
  EXPECT_TRUE(std::isnan(float(float16::from_bits(0x7c01))));  // signalling NaN is still NaN
  EXPECT_TRUE(std::signbit(float(float16::from_bits(0xfe00))));
  EXPECT_EQ(float16{}.bits(), 0);
}

TEST(Float16, NanStaysNan) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const std::uint16_t q = float16(qnan).bits();
  EXPECT_EQ(q & 0x7c00, 0x7c00);
  EXPECT_NE(q & 0x03ff, 0);
  EXPECT_EQ(float16(-qnan).bits() & 0x8000, 0x8000);
  // A NaN whose payload lives only in the low float bits (dropped by the shift) stays NaN.
  const std::uint16_t low = float16(f32(0x7f800001u)).bits();
  EXPECT_EQ(low & 0x7c00, 0x7c00);
  EXPECT_NE(low & 0x03ff, 0);
}

TEST(Float16, EveryBitPatternRoundTripsThroughFloat) {
  int nans = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float16 h = float16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h;
    if (std::isnan(f)) {
      ++nans;
      EXPECT_TRUE(std::isnan(float(float16(f)))) << std::hex << b;
      EXPECT_EQ((b & 0x7c00), 0x7c00u) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float16(f).bits(), b) << std::hex << b << " -> " << f;
  }
  EXPECT_EQ(nans, 2 * 1023);  // exponent all ones, mantissa non-zero, both signs
}

// An independent reference: the nearest finite half found by binary search over the ordered
// positive bit patterns, ties to the even pattern, and overflow where IEEE puts it (rounding
// with an unbounded exponent past 65504 gives 65536: inf).
std::uint16_t reference_half(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  auto value = [](std::uint32_t bits) {
    return bits == 0x7c00 ? 65536.0 : static_cast<double>(float(float16::from_bits(static_cast<std::uint16_t>(bits))));
  };
  if (a >= 65536.0) return sign | 0x7c00;
  std::uint32_t lo = 0, hi = 0x7c00;  // value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    (value(mid) <= a ? lo : hi) = mid;
  }
  const double dlo = a - value(lo), dhi = value(hi) - a;
  const std::uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return static_cast<std::uint16_t>(sign | pick);
}

TEST(Float16, FromFloatIsNearestEvenAcrossTheFloatRange) {
  // Every 9973rd float bit pattern (both signs, all exponents), plus the neighbours of each half
  // value and of each half-way point between neighbouring halves.
  std::vector<float> samples;
  for (std::uint64_t b = 0; b < 0x100000000ull; b += 9973) samples.push_back(f32(static_cast<std::uint32_t>(b)));
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = float(float16::from_bits(static_cast<std::uint16_t>(h)));
    const double next =
        h + 1 == 0x7c00 ? 65536.0 : double(float(float16::from_bits(static_cast<std::uint16_t>(h + 1))));
    const float mid = static_cast<float>((v + next) / 2);  // exact in float
    for (float x : {static_cast<float>(v), mid}) {
      samples.push_back(x);
      samples.push_back(std::nextafter(x, 0.0f));
      samples.push_back(std::nextafter(x, 1e30f));
    }
  }
  int64_t wrong = 0;
  for (float f : samples) {
    if (std::isnan(f)) continue;
    const std::uint16_t got = float16(f).bits(), want = reference_half(f);
    if (got != want && ++wrong <= 5) ADD_FAILURE() << "float16(" << f << "): got " << got << ", want " << want;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(samples.size(), 600000u);
}

TEST(BFloat16, FromFloatMatchesTheReferenceTable) {
  const Row rows[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3f80},
      {-2.0f, 0xc000},
      {0.1f, 0x3dcd},
      {1.0f / 3.0f, 0x3eab},
      {1.0f + std::ldexp(1.0f, -8), 0x3f80},                          // tie: even (down)
      {1.0f + 3 * std::ldexp(1.0f, -8), 0x3f82},                      // tie: even (up)
      {1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), 0x3f81},  // just above the tie
      {f32(0x7f7f7fffu), 0x7f7f},                                     // below the half-way point
      {f32(0x7f7f8000u), 0x7f80},                                     // half-way, odd: overflows to inf
      {std::numeric_limits<float>::max(), 0x7f80},
      {-std::numeric_limits<float>::max(), 0xff80},
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {f32(0x00010000u), 0x0001},  // float subnormals keep their upper bits
      {f32(0x00008000u), 0x0000},  // tie: even
      {f32(0x00018000u), 0x0002},  // tie: even (up)
      {256.0f, 0x4380},
      {257.0f, 0x4380},  // integers above 256 step by 2: tie to even
      {259.0f, 0x4382},
  };
  for (const Row& r : rows) EXPECT_EQ(bfloat16(r.in).bits(), r.want) << "bfloat16(" << r.in << ")";
  const std::uint16_t nan = bfloat16(std::numeric_limits<float>::quiet_NaN()).bits();
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_TRUE(std::isnan(float(bfloat16(f32(0x7f800001u)))));  // payload only in the dropped bits
  EXPECT_EQ(float(bfloat16::from_bits(0x7f7f)), f32(0x7f7f0000u));
  EXPECT_EQ(float(bfloat16::from_bits(0x3eab)), 0.333984375f);
}

TEST(BFloat16, EveryBitPatternRoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float(bfloat16(f)))) << std::hex << b;
    } else {
      ASSERT_EQ(bfloat16(f).bits(), b) << std::hex << b;
    }
  }
}

template <class T>
std::vector<float> floats(const Tensor<T>& t) {
  std::vector<float> out;
  for (T v : t.to_vector()) out.push_back(static_cast<float>(v));
  return out;
}

template <class H>
Tensor<H> half_tensor(std::vector<float> values) {
  std::vector<H> v;
  for (float f : values) v.push_back(H(f));
  return Tensor<H>::from_vector(v, {static_cast<int64_t>(v.size())});
}

TEST(HalfTensor, ElementWiseOpsComputeInFloatAndRoundOnce) {
  using F = std::vector<float>;
  const auto a = half_tensor<float16>({2048, 1, 65504, 0.1f, -3});
  const auto b = half_tensor<float16>({1, 3, 65504, 3, 2});
  EXPECT_EQ(Tensor<float16>::dtype(), DType::float16);
  // 2049 rounds to 2048 (even); 65504 + 65504 overflows to inf; 0.1 * 3 rounds once.
  EXPECT_EQ(floats(a + b),
            (F{2048, 4, std::numeric_limits<float>::infinity(), float(float16(float(float16(0.1f)) + 3)), -1}));
  EXPECT_EQ(floats(a - b), (F{2047, -2, 0, float(float16(float(float16(0.1f)) - 3)), -5}));
  EXPECT_EQ(floats(a * b),
            (F{2048, 3, std::numeric_limits<float>::infinity(), float(float16(float(float16(0.1f)) * 3)), -6}));
  EXPECT_EQ(floats(b / a), (F{float(float16(1.0f / 2048)), 3, 1, float(float16(3 / float(float16(0.1f)))),
                              float(float16(-2.0f / 3))}));
  EXPECT_EQ(floats(a * 2), (F{4096, 2, std::numeric_limits<float>::infinity(), float(float16(0.1f)) * 2, -6}));
  EXPECT_EQ(floats(1 - a), (F{-2047, 0, -65504, float(float16(1 - float(float16(0.1f)))), 4}));
  // Division by zero follows IEEE, as for float.
  const auto q = floats(half_tensor<float16>({1, -1, 0}) / half_tensor<float16>({0, 0, 0}));
  EXPECT_EQ(q[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(q[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(q[2]));

  const auto c = half_tensor<bfloat16>({256, 1, 3, 0.5f});
  const auto d = half_tensor<bfloat16>({1, 2, 3, 0.25f});
  EXPECT_EQ(floats(c + d), (F{256, 3, 6, 0.75f}));  // 257 rounds to 256 (even)
  EXPECT_EQ(floats(c * d), (F{256, 2, 9, 0.125f}));
  EXPECT_EQ(floats(c / d), (F{256, 0.5f, 1, 2}));
  EXPECT_EQ(floats(Tensor<bfloat16>::full({2}, bfloat16(1.5f)) + 1), (F{2.5f, 2.5f}));
  EXPECT_EQ(floats(Tensor<float16>::zeros({2})), (F{0, 0}));
}

TEST(HalfTensor, CastsBetweenEveryDtype) {
  using F = std::vector<float>;
  const auto f = Tensor<float>::from_vector({1.5f, -2.0f, 65504.0f, 65520.0f, 1e-8f, 2049.0f}, {6});
  const auto h = cast<float16>(f);
  EXPECT_EQ(floats(h), (F{1.5f, -2, 65504, std::numeric_limits<float>::infinity(), 0, 2048}));
  const auto bf = cast<bfloat16>(f);
  EXPECT_EQ(floats(bf), (F{1.5f, -2, 65536, 65536, float(bfloat16(1e-8f)), 2048}));
  EXPECT_EQ(float(bfloat16(1e-8f)), float(cast<bfloat16>(Tensor<double>::scalar(1e-8)).item()));

  const auto small = half_tensor<float16>({1.5f, -2, 200, 0, 7});
  EXPECT_EQ(cast<double>(small).to_vector(), (std::vector<double>{1.5, -2, 200, 0, 7}));
  EXPECT_EQ(cast<float>(small).to_vector(), (std::vector<float>{1.5f, -2, 200, 0, 7}));
  EXPECT_EQ(cast<int32_t>(small).to_vector(), (std::vector<int32_t>{1, -2, 200, 0, 7}));  // truncates like static_cast
  EXPECT_EQ(cast<int64_t>(small).to_vector(), (std::vector<int64_t>{1, -2, 200, 0, 7}));
  EXPECT_EQ(cast<uint8_t>(half_tensor<float16>({1.5f, 200, 0})).to_vector(), (std::vector<uint8_t>{1, 200, 0}));
  EXPECT_EQ(floats(cast<bfloat16>(small)), (F{1.5f, -2, 200, 0, 7}));
  EXPECT_EQ(floats(cast<float16>(half_tensor<bfloat16>({1.5f, -2, 200, 0, 7}))), (F{1.5f, -2, 200, 0, 7}));
  // bfloat16 -> float16 rounds to float16 (and overflows like any float).
  EXPECT_EQ(floats(cast<float16>(half_tensor<bfloat16>({1e5f, 1.0f / 3}))),
            (F{std::numeric_limits<float>::infinity(), float(float16(float(bfloat16(1.0f / 3))))}));
  EXPECT_EQ(floats(cast<float16>(Tensor<int32_t>{2049, -3, 70000})),
            (F{2048, -3, std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(floats(cast<float16>(Tensor<int64_t>{2051, 5})), (F{2052, 5}));
  EXPECT_EQ(floats(cast<float16>(Tensor<uint8_t>{255, 0})), (F{255, 0}));
  EXPECT_EQ(floats(cast<bfloat16>(Tensor<int32_t>{257, 259})), (F{256, 260}));
  EXPECT_EQ(floats(cast<float16>(Tensor<double>{0.1, 65519.0})), (F{float(float16(0.1f)), 65504}));
}

TEST(HalfTensor, PrintsLikeNumpy) {
  // numpy: [str(x) for x in np.array([0.1, 65504, 1/3, -0.0, 1e-7, 2**-24], dtype=np.float16)]
  const auto h = half_tensor<float16>({0.1f, 65504, 1.0f / 3, -0.0f, 1e-7f, std::ldexp(1.0f, -24)});
  std::ostringstream os;
  os << h;
  EXPECT_EQ(os.str(), "<Tensor: shape=(6,), dtype=float16, value=[0.1, 6.55e+04, 0.3333, -0.0, 1e-07, 6e-08]>");
  os.str("");
  os << half_tensor<float16>(
      {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 2048, 1.5f, 999, 1000});
  EXPECT_EQ(os.str(), "<Tensor: shape=(6,), dtype=float16, value=[inf, nan, 2.048e+03, 1.5, 999.0, 1e+03]>");
  os.str("");
  os << half_tensor<bfloat16>({0.1f, 1.0f / 3, 256, 3e38f});
  EXPECT_EQ(os.str(), "<Tensor: shape=(4,), dtype=bfloat16, value=[0.1, 0.334, 256.0, 3e+38]>");
  EXPECT_EQ(repr(half_tensor<float16>({1})), "<Tensor: shape=(1,), dtype=float16, value=[1.0]>");
  EXPECT_STREQ(dtype_name(DType::float16), "float16");
  EXPECT_STREQ(dtype_name(DType::bfloat16), "bfloat16");
  EXPECT_EQ(dtype_size(DType::float16), 2u);
  EXPECT_EQ(dtype_size(DType::bfloat16), 2u);
}

TEST(HalfTensor, AverageLossSumsInDoubleAndRoundsOnce) {
  // Summed in double: 2052 / 4 = 513 (a float16 running sum would stay at 2048 after 2048 + 1).
  const auto loss = half_tensor<float16>({2048, 1, 1, 2});
  EXPECT_EQ(float(nn::compute_average_loss(loss, 4).item()), 513.0f);
  EXPECT_EQ(float(nn::compute_average_loss(half_tensor<bfloat16>({1, 2}), 4).item()), 0.75f);
}

}  // namespace
}  // namespace mirrored
