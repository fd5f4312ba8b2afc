// The host backend's float16 kernels (cast float32 <-> float16, sum_n and sum_n_mean of float16),
// which use F16C where the CPU has it (src/device/host/host_half.cpp), give exactly the bits of
// half.hpp's scalar conversions (test_half.cpp checks those against independent references):
// every float16 widened, a dense sample of floats narrowed (every sign, exponent and top mantissa
// bits, with the low bits at and around each rounding point), also with MXCSR's flush-to-zero and
// denormals-are-zero set, sums of random bit patterns (NaN, infinities, subnormals) and every
// length of tail. (Without F16C this compares the portable loops with themselves.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "device/host/host_half.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/half.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace mirrored {
namespace {

using detail::backend_for;

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Sets MXCSR's FTZ and DAZ (x86-64) while alive: the vector path must not depend on them.
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__x86_64__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);
#endif
  }
  ~FlushDenormals() {
#if defined(__x86_64__)
    _mm_setcsr(saved_);
#endif
  }

 private:
  unsigned saved_ = 0;
};

void expect_every_half_widens_exactly() {
  std::vector<uint16_t> halves(65536);
  for (uint32_t b = 0; b < 65536; ++b) halves[b] = static_cast<uint16_t>(b);
  std::vector<float> got(halves.size());
  backend_for(cpu0).cast(DType::float16, halves.data(), DType::float32, got.data(), 65536);
  int wrong = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float want = float16::from_bits(static_cast<uint16_t>(b));
    if (bits_of(got[b]) != bits_of(want) && ++wrong <= 5)
      ADD_FAILURE() << std::hex << "float16 " << b << " widened to " << bits_of(got[b]) << ", want " << bits_of(want);
  }
  EXPECT_EQ(wrong, 0);
}

// Every float whose low 12 bits are one of the patterns around a rounding point (the bit above
// them, enumerated with the rest, decides a normal half's rounding; a subnormal's is higher).
void expect_floats_narrow_exactly() {
  const uint32_t lows[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff};
  std::vector<float> floats;
  floats.reserve((std::size_t{1} << 20) * std::size(lows));
  for (uint32_t high = 0; high < (1u << 20); ++high) {
    for (uint32_t low : lows) {
      const uint32_t b = high << 12 | low;
      float f;
      std::memcpy(&f, &b, sizeof(f));
      floats.push_back(f);
    }
  }
  std::vector<uint16_t> got(floats.size());
  backend_for(cpu0).cast(DType::float32, floats.data(), DType::float16, got.data(),
                         static_cast<int64_t>(floats.size()));
  int wrong = 0;
  for (std::size_t i = 0; i < floats.size(); ++i) {
    const uint16_t want = float16(floats[i]).bits();
    if (got[i] != want && ++wrong <= 5)
      ADD_FAILURE() << std::hex << "float " << bits_of(floats[i]) << " narrowed to " << got[i] << ", want " << want;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(HostHalf, CastsGiveTheScalarConversionsBits) {
  RecordProperty("f16c", detail::host_has_f16c() ? "yes" : "no");
  expect_every_half_widens_exactly();
  expect_floats_narrow_exactly();
}

TEST(HostHalf, CastsIgnoreFlushToZero) {
  FlushDenormals flush;
  expect_every_half_widens_exactly();
  expect_floats_narrow_exactly();
}

// Lengths 0 to 17 from odd offsets: the tails shorter than eight elements.
TEST(HostHalf, EveryTailLengthConverts) {
  std::mt19937 rng(7);
  std::vector<float> src(40);
  for (auto& f : src) f = std::uniform_real_distribution<float>(-70000.0f, 70000.0f)(rng);
  for (int64_t n = 0; n <= 17; ++n) {
    std::vector<uint16_t> halves(40, 0xabcd);
    backend_for(cpu0).cast(DType::float32, src.data() + 3, DType::float16, halves.data() + 1, n);
    std::vector<float> back(40, -1.0f);
    backend_for(cpu0).cast(DType::float16, halves.data() + 1, DType::float32, back.data() + 5, n);
    for (int64_t i = 0; i < 40; ++i) {
      const bool inside = i >= 1 && i < 1 + n;
      const uint16_t want_half = inside ? float16(src[static_cast<std::size_t>(i + 2)]).bits() : 0xabcd;
      EXPECT_EQ(halves[static_cast<std::size_t>(i)], want_half) << "n=" << n << " i=" << i;
      const bool back_inside = i >= 5 && i < 5 + n;
      const float want = back_inside ? float(float16(src[static_cast<std::size_t>(i - 2)])) : -1.0f;
      EXPECT_EQ(bits_of(back[static_cast<std::size_t>(i)]), bits_of(want)) << "n=" << n << " i=" << i;
    }
  }
}

// sum_n and sum_n_mean of float16: the float sum in input order, divided for a mean, rounded once
// (the same bits, except which NaN comes out of adding NaNs).
TEST(HostHalf, SumsGiveTheScalarLoopsBits) {
  std::mt19937 rng(11);
  for (int inputs = 1; inputs <= 5; ++inputs) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{37}, int64_t{4099}}) {
      std::vector<std::vector<uint16_t>> data(static_cast<std::size_t>(inputs));
      std::vector<const void*> ptrs;
      for (auto& d : data) {
        d.resize(static_cast<std::size_t>(n));
        // Random bit patterns: every class of value, NaNs and infinities included; and small
        // integers, whose sums are exact.
        for (int64_t i = 0; i < n; ++i)
          d[static_cast<std::size_t>(i)] =
              i % 3 ? static_cast<uint16_t>(rng()) : float16(static_cast<float>(rng() % 200) - 100.0f).bits();
        ptrs.push_back(d.data());
      }
      for (int64_t divisor : {int64_t{0}, int64_t{3}}) {
        std::vector<uint16_t> got(static_cast<std::size_t>(n) + 1, 0x1234);
        if (divisor == 0)
          backend_for(cpu0).sum_n(DType::float16, ptrs.data(), inputs, got.data(), n);
        else
          backend_for(cpu0).sum_n_mean(DType::float16, ptrs.data(), inputs, got.data(), n, divisor);
        for (int64_t i = 0; i < n; ++i) {
          float acc = float16::from_bits(data[0][static_cast<std::size_t>(i)]);
          for (int k = 1; k < inputs; ++k)
            acc = acc + static_cast<float>(
                            float16::from_bits(data[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)]));
          if (divisor > 0) acc = acc / static_cast<float>(divisor);
          // Which NaN an addition of two NaNs returns depends on the operand order the compiler
          // picked (addition commutes): only NaN-ness is compared there.
          const uint16_t want = float16(acc).bits(), have = got[static_cast<std::size_t>(i)];
          const bool nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff) != 0;
          const bool have_nan = (have & 0x7c00) == 0x7c00 && (have & 0x3ff) != 0;
          ASSERT_TRUE(nan ? have_nan : have == want)
              << std::hex << have << " instead of " << want << std::dec << ": inputs=" << inputs << " n=" << n
              << " i=" << i << " divisor=" << divisor;
        }
        EXPECT_EQ(got[static_cast<std::size_t>(n)], 0x1234) << "wrote past the end";
      }
    }
  }
}

}  // namespace
}  // namespace mirrored
