// CRC-32 (src/util/crc32.hpp): every kernel this CPU supports gives zlib's crc32 for every length up
// to 4096 at every alignment, for large random buffers, and in chained pieces; the run-time switch.
#include <gtest/gtest.h>

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "util/crc32.hpp"

namespace mirrored::detail {
namespace {

constexpr Crc32Kernel kAllKernels[] = {Crc32Kernel::kZlib, Crc32Kernel::kPclmul, Crc32Kernel::kVpclmul512};

/// zlib's value (inputs here are far below its 4 GiB length limit).
std::uint32_t zlib_crc32(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  return static_cast<std::uint32_t>(::crc32(crc, p, static_cast<uInt>(n)));
}

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<std::size_t>(8, n - i));
  }
  return v;
}

/// Restores the kernel `crc32_update` uses when a test that changed it ends.
class KernelGuard {
 public:
  KernelGuard() : saved_(crc32_kernel()) {}
  ~KernelGuard() { set_crc32_kernel(saved_); }
  KernelGuard(const KernelGuard&) = delete;
  KernelGuard& operator=(const KernelGuard&) = delete;

 private:
  Crc32Kernel saved_;
};

class Crc32 : public ::testing::TestWithParam<Crc32Kernel> {
 protected:
  void SetUp() override {
    if (!crc32_kernel_supported(GetParam()))
      GTEST_SKIP() << "the " << crc32_kernel_name(GetParam()) << " kernel needs a CPU feature this one lacks";
  }
  std::uint32_t crc(std::uint32_t start, const unsigned char* p, std::size_t n) const {
    return crc32_update(GetParam(), start, p, n);
  }
};

TEST_P(Crc32, CheckValues) {
  // The standard check value of CRC-32 (zlib's), and the empty input from two starting values.
  const auto* digits = reinterpret_cast<const unsigned char*>("123456789");
  EXPECT_EQ(crc(0, digits, 9), 0xCBF43926u);
  EXPECT_EQ(crc(0, digits, 0), 0u);
  EXPECT_EQ(crc(0x12345678u, digits, 0), 0x12345678u);
  // 4096 zero bytes and 4096 bytes of 0xFF, long enough for every folding loop.
  const std::vector<unsigned char> zeros(4096, 0x00), ones(4096, 0xFF);
  EXPECT_EQ(crc(0, zeros.data(), zeros.size()), zlib_crc32(0, zeros.data(), zeros.size()));
  EXPECT_EQ(crc(0, ones.data(), ones.size()), zlib_crc32(0, ones.data(), ones.size()));
}

TEST_P(Crc32, EqualsZlibForEveryLengthUpTo4096AtEveryAlignment) {
  const std::vector<unsigned char> buf = random_bytes(4096 + 64, 12);
  int mismatches = 0;
  std::ostringstream first;
  for (std::size_t align = 0; align < 64; ++align) {
    for (std::size_t len = 0; len <= 4096; ++len) {
      const unsigned char* p = buf.data() + align;
      // From the start (0) and continuing from a previous value.
      for (const std::uint32_t start : {0u, 0x9E3779B9u}) {
        const std::uint32_t want = zlib_crc32(start, p, len);
        const std::uint32_t got = crc(start, p, len);
        if (got != want && mismatches++ == 0)
          first << "alignment " << align << ", length " << len << ", start 0x" << std::hex << start << ": got 0x" << got
                << ", zlib 0x" << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "first: " << first.str();
}

TEST_P(Crc32, EqualsZlibForRandomSizesUpTo64MiB) {
  constexpr std::size_t kMax = std::size_t{64} << 20;
  const std::vector<unsigned char> buf = random_bytes(kMax + 64, 34);
  std::mt19937_64 rng(56);
  std::vector<std::size_t> sizes = {kMax, kMax - 1, (std::size_t{1} << 20) + 255};
  for (int i = 0; i < 5; ++i) sizes.push_back(std::uniform_int_distribution<std::size_t>(1, kMax)(rng));
  for (const std::size_t size : sizes) {
    const std::size_t align = std::uniform_int_distribution<std::size_t>(0, 64)(rng);
    const std::size_t n = std::min(size, buf.size() - align);
    EXPECT_EQ(crc(0, buf.data() + align, n), zlib_crc32(0, buf.data() + align, n))
        << n << " bytes at alignment " << align;
  }
}

TEST_P(Crc32, PiecesChainToTheCrcOfTheWhole) {
  const std::vector<unsigned char> buf = random_bytes((std::size_t{3} << 20) + 77, 78);
  const std::uint32_t whole = zlib_crc32(0, buf.data(), buf.size());
  std::mt19937_64 rng(90);
  // Pieces of every scale: empty, shorter than a block, around the loop widths, long.
  const std::size_t limits[] = {0, 15, 70, 300, 5000, 300000};
  std::uint32_t c = 0;
  std::size_t off = 0;
  for (int i = 0; off < buf.size(); ++i) {
    const std::size_t limit = limits[i % std::size(limits)];
    const std::size_t n = std::min(std::uniform_int_distribution<std::size_t>(0, limit)(rng), buf.size() - off);
    c = crc(c, buf.data() + off, n);
    off += n;
  }
  EXPECT_EQ(c, whole);
  // Pieces computed by different kernels chain as well: each one's value is zlib's.
  c = 0;
  off = 0;
  for (int i = 0; off < buf.size(); ++i) {
    const std::size_t n = std::min<std::size_t>(4096 + 33 * i, buf.size() - off);
    const Crc32Kernel kernel = i % 2 == 0 ? GetParam() : Crc32Kernel::kZlib;
    c = crc32_update(kernel, c, buf.data() + off, n);
    off += n;
  }
  EXPECT_EQ(c, whole);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Crc32, ::testing::ValuesIn(kAllKernels),
                         [](const ::testing::TestParamInfo<Crc32Kernel>& info) {
                           return std::string(crc32_kernel_name(info.param));
                         });

TEST(Crc32Switch, DefaultsToTheFastestSupportedKernel) {
  const Crc32Kernel fastest = crc32_kernel_supported(Crc32Kernel::kVpclmul512) ? Crc32Kernel::kVpclmul512
                              : crc32_kernel_supported(Crc32Kernel::kPclmul)   ? Crc32Kernel::kPclmul
                                                                               : Crc32Kernel::kZlib;
  EXPECT_EQ(crc32_kernel(), fastest) << "using " << crc32_kernel_name(crc32_kernel());
  EXPECT_TRUE(crc32_kernel_supported(Crc32Kernel::kZlib));
}

TEST(Crc32Switch, ForcesEachSupportedKernelAndRefusesTheOthers) {
  const KernelGuard guard;
  const std::vector<unsigned char> buf = random_bytes(100000, 11);
  const std::uint32_t want = zlib_crc32(0, buf.data(), buf.size());
  for (const Crc32Kernel kernel : kAllKernels) {
    const Crc32Kernel before = crc32_kernel();
    if (!crc32_kernel_supported(kernel)) {
      EXPECT_FALSE(set_crc32_kernel(kernel)) << crc32_kernel_name(kernel);
      EXPECT_EQ(crc32_kernel(), before);
      // Asking for it directly gives zlib's path, not an illegal instruction.
      EXPECT_EQ(crc32_update(kernel, 0, buf.data(), buf.size()), want);
      continue;
    }
    ASSERT_TRUE(set_crc32_kernel(kernel)) << crc32_kernel_name(kernel);
    EXPECT_EQ(crc32_kernel(), kernel);
    EXPECT_EQ(crc32_update(0, buf.data(), buf.size()), want) << crc32_kernel_name(kernel);
  }
}

}  // namespace
}  // namespace mirrored::detail
