// Unit tests for the printed forms: number formatting (Python / numpy repr), shapes, `repr` of
// numbers and nests, and PerReplica / Mirrored (docs/api.md §2, §3).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "mirrored/detail/format.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/repr.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;

template <class X>
std::string str(const X& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// format_float: Python's repr(float) for doubles, numpy's repr for float32
// ---------------------------------------------------------------------------------------------

struct FloatCase {
  double value;
  bool single;
  std::string expected;
};

void PrintTo(const FloatCase& c, std::ostream* os) { *os << (c.single ? "float32 " : "float64 ") << c.expected; }

class FormatFloatTest : public ::testing::TestWithParam<FloatCase> {};

TEST_P(FormatFloatTest, MatchesPythonRepr) {
  const FloatCase& c = GetParam();
  EXPECT_EQ(detail::format_float(c.value, c.single), c.expected);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// Expected strings are Python's repr() of the double, and numpy's repr() of np.float32(value)
// (float32 cases stay below 1e6, where numpy < 2.3 and >= 2.3 agree on positional form).
INSTANTIATE_TEST_SUITE_P(
    Doubles, FormatFloatTest,
    ::testing::Values(FloatCase{1.0, false, "1.0"}, FloatCase{0.5, false, "0.5"}, FloatCase{-2.0, false, "-2.0"},
                      FloatCase{0.1, false, "0.1"}, FloatCase{1e-05, false, "1e-05"},
                      FloatCase{0.0001, false, "0.0001"}, FloatCase{123456789.0, false, "123456789.0"},
                      FloatCase{1e16, false, "1e+16"}, FloatCase{1.5e16, false, "1.5e+16"},
                      FloatCase{1e22, false, "1e+22"}, FloatCase{3.14159, false, "3.14159"},
                      FloatCase{std::nan(""), false, "nan"}, FloatCase{kInf, false, "inf"},
                      FloatCase{-kInf, false, "-inf"}, FloatCase{-0.0, false, "-0.0"}, FloatCase{0.0, false, "0.0"},
                      FloatCase{100.0, false, "100.0"}, FloatCase{2.5e-07, false, "2.5e-07"},
                      FloatCase{9999999999999998.0, false, "9999999999999998.0"}, FloatCase{0.00012, false, "0.00012"},
                      FloatCase{1234.5, false, "1234.5"}, FloatCase{-1e-05, false, "-1e-05"},
                      FloatCase{1.1529215046068470e18, false, "1.152921504606847e+18"},
                      FloatCase{0.1 + 0.2, false, "0.30000000000000004"}, FloatCase{5e-324, false, "5e-324"},
                      FloatCase{1.7976931348623157e308, false, "1.7976931348623157e+308"},
                      FloatCase{-123.25, false, "-123.25"}, FloatCase{1e15, false, "1000000000000000.0"}));

INSTANTIATE_TEST_SUITE_P(Float32, FormatFloatTest,
                         ::testing::Values(FloatCase{0.1f, true, "0.1"}, FloatCase{1.0f, true, "1.0"},
                                           FloatCase{0.5f, true, "0.5"}, FloatCase{-2.0f, true, "-2.0"},
                                           FloatCase{3.14159f, true, "3.14159"}, FloatCase{100.0f, true, "100.0"},
                                           FloatCase{1e-05f, true, "1e-05"}, FloatCase{2.5e-07f, true, "2.5e-07"},
                                           FloatCase{1234.5f, true, "1234.5"}, FloatCase{65504.0f, true, "65504.0"},
                                           FloatCase{1e16f, true, "1e+16"}, FloatCase{-0.0f, true, "-0.0"},
                                           FloatCase{std::nan(""), true, "nan"}, FloatCase{kInf, true, "inf"},
                                           FloatCase{-kInf, true, "-inf"}, FloatCase{0.3f, true, "0.3"},
                                           FloatCase{1.0f / 3.0f, true, "0.33333334"}));

TEST(FormatFloat, SinglePrecisionUsesFloatDigits) {
  // The same double prints with its own (double) shortest digits when not single precision.
  EXPECT_EQ(detail::format_float(static_cast<double>(0.1f), false), "0.10000000149011612");
  EXPECT_EQ(detail::format_float(static_cast<double>(0.1f), true), "0.1");
}

TEST(FormatElement, NumbersPrintLikePython) {
  EXPECT_EQ(detail::format_element(1.0f), "1.0");
  EXPECT_EQ(detail::format_element(0.1f), "0.1");
  EXPECT_EQ(detail::format_element(2.0), "2.0");
  EXPECT_EQ(detail::format_element(int32_t{-7}), "-7");
  EXPECT_EQ(detail::format_element(int64_t{9000000000}), "9000000000");
  EXPECT_EQ(detail::format_element(uint8_t{255}), "255");
  EXPECT_EQ(detail::format_element(true), "True");
  EXPECT_EQ(detail::format_element(false), "False");
}

// ---------------------------------------------------------------------------------------------
// Shapes and values
// ---------------------------------------------------------------------------------------------

TEST(FormatShape, PythonTuples) {
  EXPECT_EQ(detail::format_shape({}), "()");
  EXPECT_EQ(detail::format_shape({2}), "(2,)");
  EXPECT_EQ(detail::format_shape({4, 1}), "(4, 1)");
  EXPECT_EQ(detail::format_shape({2, 3, 4}), "(2, 3, 4)");
  EXPECT_EQ(detail::format_shape({0}), "(0,)");
  EXPECT_EQ(detail::format_shape({0, 5}), "(0, 5)");
}

TEST(ShapeNumel, Products) {
  EXPECT_EQ(detail::shape_numel({}), 1);
  EXPECT_EQ(detail::shape_numel({5}), 5);
  EXPECT_EQ(detail::shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(detail::shape_numel({2, 0, 4}), 0);
  try {
    (void)detail::shape_numel({2, -1});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(2, -1)"));
  }
}

// Regression: {1<<32, 1<<32} had numel 0 by signed overflow.
TEST(ShapeNumel, OverflowIsRejectedNamingTheShape) {
  constexpr int64_t k32 = int64_t{1} << 32;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(detail::checked_numel({k32, k32}), std::nullopt);
  EXPECT_EQ(detail::checked_numel({kMax, 2}), std::nullopt);
  EXPECT_EQ(detail::checked_numel({kMax}), kMax);
  EXPECT_EQ(detail::checked_numel({kMax}, 2), std::nullopt);  // elements fit, bytes do not
  EXPECT_EQ(detail::checked_numel({kMax / 8}, 8), kMax / 8);  // the largest float64 vector
  EXPECT_EQ(detail::checked_numel({kMax / 8 + 1}, 8), std::nullopt);
  EXPECT_EQ(detail::checked_numel({int64_t{1} << 62, 2}), std::nullopt);
  EXPECT_EQ(detail::checked_numel({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  // A zero dimension makes the count 0, but the other dimensions still have to fit together
  // (row sizes and strides are computed from them).
  EXPECT_EQ(detail::checked_numel({0, k32}), 0);
  EXPECT_EQ(detail::checked_numel({0, k32, k32}), std::nullopt);
  EXPECT_EQ(detail::checked_numel({3, -1}), std::nullopt);
  try {
    (void)detail::shape_numel({k32, k32}, 4);
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("shape (4294967296, 4294967296) is too large"));
    EXPECT_THAT(e.what(), HasSubstr("overflows int64"));
  }
  EXPECT_THROW((void)detail::shape_numel({kMax}, 4), InvalidArgumentError);
}

TEST(FormatValues, NestedLists) {
  const int32_t v[] = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(detail::format_values(v, {}), "1");
  EXPECT_EQ(detail::format_values(v, {3}), "[1, 2, 3]");
  EXPECT_EQ(detail::format_values(v, {2, 3}), "[[1, 2, 3], [4, 5, 6]]");
  EXPECT_EQ(detail::format_values(v, {3, 2}), "[[1, 2], [3, 4], [5, 6]]");
  EXPECT_EQ(detail::format_values(v, {3, 1, 2}), "[[[1, 2]], [[3, 4]], [[5, 6]]]");
  EXPECT_EQ(detail::format_values(v, {0}), "[]");
  const float f[] = {0.5f, 1.0f};
  EXPECT_EQ(detail::format_values(f, {2}), "[0.5, 1.0]");
}

TEST(Format, ValuesAboveTheThresholdAreSummarisedLikeNumpy) {
  std::vector<int64_t> v(2500);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i);
  // 1000 elements: printed whole (numpy summarises only above its threshold).
  const std::string whole = detail::format_values(v.data(), {1000});
  EXPECT_EQ(whole.substr(0, 10), "[0, 1, 2, ");
  EXPECT_EQ(whole.find("..."), std::string::npos);
  EXPECT_EQ(detail::format_values(v.data(), {1001}), "[0, 1, 2, ..., 998, 999, 1000]");
  EXPECT_EQ(detail::format_values(v.data(), {50, 50}),
            "[[0, 1, 2, ..., 47, 48, 49], [50, 51, 52, ..., 97, 98, 99], [100, 101, 102, ..., 147, 148, 149], ..., "
            "[2350, 2351, 2352, ..., 2397, 2398, 2399], [2400, 2401, 2402, ..., 2447, 2448, 2449], "
            "[2450, 2451, 2452, ..., 2497, 2498, 2499]]");
  // Short dimensions of a summarised array stay whole.
  EXPECT_EQ(detail::format_values(v.data(), {2, 1250}).substr(0, 26), "[[0, 1, 2, ..., 1247, 1248");
  EXPECT_EQ(detail::format_values(v.data(), {1250, 2}),
            "[[0, 1], [2, 3], [4, 5], ..., [2494, 2495], [2496, 2497], [2498, 2499]]");
}

// ---------------------------------------------------------------------------------------------
// repr
// ---------------------------------------------------------------------------------------------

TEST(Repr, Numbers) {
  EXPECT_EQ(repr(1), "1");
  EXPECT_EQ(repr(-42), "-42");
  EXPECT_EQ(repr(int64_t{1} << 40), "1099511627776");
  EXPECT_EQ(repr(2.0), "2.0");
  EXPECT_EQ(repr(0.5), "0.5");
  EXPECT_EQ(repr(0.1f), "0.1");
  EXPECT_EQ(repr(1e-05), "1e-05");
  EXPECT_EQ(repr(true), "True");
}

TEST(Repr, Strings) {
  EXPECT_EQ(repr(std::string("x")), "'x'");
  EXPECT_EQ(repr(std::string("")), "''");
  EXPECT_EQ(repr("abc"), "'abc'");
  EXPECT_EQ(repr(std::string_view("sv")), "'sv'");
}

TEST(Repr, ShortVectorOnOneLine) {
  EXPECT_EQ(repr(std::vector<int>{1, 2}), "[1, 2]");
  EXPECT_EQ(repr(std::vector<double>{1.0, 0.5}), "[1.0, 0.5]");
  EXPECT_EQ(repr(std::vector<int>{}), "[]");
  EXPECT_EQ(repr(std::vector<int>{7}), "[7]");
  EXPECT_EQ(repr(std::vector<std::vector<int>>{{1, 2}, {3}}), "[[1, 2], [3]]");
  EXPECT_EQ(repr(std::vector<std::string>{"a", "b"}), "['a', 'b']");
}

TEST(Repr, LongVectorWrapsOneElementPerLine) {
  std::vector<int> v;
  std::string expected = "[";
  for (int i = 1000; i < 1020; ++i) {
    v.push_back(i);
    if (i > 1000) expected += ",\n ";
    expected += std::to_string(i);
  }
  expected += "]";
  EXPECT_EQ(repr(v), expected);
  EXPECT_EQ(repr(v).substr(0, 14), "[1000,\n 1001,\n");
}

TEST(Repr, VectorOfTensorsWrapsOneTensorPerLine) {
  const std::vector<Tensor<float>> v = {Tensor<float>::scalar(1.0f), Tensor<float>::scalar(2.0f)};
  EXPECT_EQ(repr(v),
            "[<Tensor: shape=(), dtype=float32, value=1.0>,\n"
            " <Tensor: shape=(), dtype=float32, value=2.0>]");
  const std::vector<Tensor<int32_t>> one = {Tensor<int32_t>{1, 2}};
  EXPECT_EQ(repr(one), "[<Tensor: shape=(2,), dtype=int32, value=[1, 2]>]");
}

TEST(Repr, Tuples) {
  EXPECT_EQ(repr(std::tuple<int, double>{1, 2.0}), "(1, 2.0)");
  EXPECT_EQ(repr(std::tuple<int>{1}), "(1,)");
  EXPECT_EQ(repr(std::tuple<>{}), "()");
  EXPECT_EQ(repr(std::make_tuple(1, std::string("x"), 0.5f)), "(1, 'x', 0.5)");
  EXPECT_EQ(repr(std::make_tuple(std::vector<int>{1, 2}, std::make_tuple(3))), "([1, 2], (3,))");
}

TEST(Repr, Maps) {
  EXPECT_EQ(repr(std::map<std::string, int>{{"a", 1}, {"b", 2}}), "{'a': 1, 'b': 2}");
  EXPECT_EQ(repr(std::map<std::string, int>{}), "{}");
  EXPECT_EQ(repr(std::map<std::string, double>{{"x", 0.5}}), "{'x': 0.5}");
  EXPECT_EQ(repr(std::map<std::string, std::vector<int>>{{"k", {1, 2}}}), "{'k': [1, 2]}");
}

TEST(Repr, TensorIsItsStreamForm) {
  EXPECT_EQ(repr(Tensor<float>{1.0f, 2.0f}), "<Tensor: shape=(2,), dtype=float32, value=[1.0, 2.0]>");
}

// ---------------------------------------------------------------------------------------------
// PerReplica / Mirrored
// ---------------------------------------------------------------------------------------------

TEST(PerReplica, AccessorsAndOrder) {
  const PerReplica<int> p({10, 20, 30});
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], 10);
  EXPECT_EQ(p[1], 20);
  EXPECT_EQ(p[2], 30);
  EXPECT_EQ(p.values(), (std::vector<int>{10, 20, 30}));
}

TEST(PerReplica, HoldsTensors) {
  const PerReplica<Tensor<float>> p({Tensor<float>{1.0f}, Tensor<float>{2.0f, 3.0f}});
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].to_vector(), (std::vector<float>{1.0f}));
  EXPECT_EQ(p[1].shape(), Shape({2}));
  EXPECT_EQ(p.values()[1].to_vector(), (std::vector<float>{2.0f, 3.0f}));
}

TEST(PerReplica, BadIndexIsOutOfRange) {
  const PerReplica<int> p({1, 2});
  try {
    (void)p[2];
    FAIL() << "no exception";
  } catch (const OutOfRangeError& e) {
    EXPECT_EQ(e.code(), ErrorCode::OUT_OF_RANGE);
    EXPECT_THAT(e.what(), HasSubstr("2"));
  }
  EXPECT_THROW((void)p[100], OutOfRangeError);
}

TEST(PerReplica, EmptyIsInvalidArgument) {
  EXPECT_THROW(PerReplica<int>(std::vector<int>{}), InvalidArgumentError);
  EXPECT_THROW(PerReplica<Tensor<float>>(std::vector<Tensor<float>>{}), InvalidArgumentError);
}

TEST(PerReplica, PrintsWithInts) {
  EXPECT_EQ(str(PerReplica<int>({1, 2})), "PerReplica:{\n  0: 1,\n  1: 2\n}");
  EXPECT_EQ(str(PerReplica<int>({5})), "PerReplica:{\n  0: 5\n}");
  EXPECT_EQ(str(PerReplica<double>({1.0, 0.5, -2.0})), "PerReplica:{\n  0: 1.0,\n  1: 0.5,\n  2: -2.0\n}");
}

TEST(PerReplica, PrintsWithTensors) {
  const PerReplica<Tensor<float>> p({Tensor<float>::scalar(1.0f), Tensor<float>::scalar(2.0f)});
  EXPECT_EQ(str(p),
            "PerReplica:{\n"
            "  0: <Tensor: shape=(), dtype=float32, value=1.0>,\n"
            "  1: <Tensor: shape=(), dtype=float32, value=2.0>\n"
            "}");
  const PerReplica<Tensor<int32_t>> q({Tensor<int32_t>{1, 2}, Tensor<int32_t>{3, 4}});
  EXPECT_EQ(str(q),
            "PerReplica:{\n"
            "  0: <Tensor: shape=(2,), dtype=int32, value=[1, 2]>,\n"
            "  1: <Tensor: shape=(2,), dtype=int32, value=[3, 4]>\n"
            "}");
}

TEST(PerReplica, PrintsNests) {
  EXPECT_EQ(str(PerReplica<std::vector<int>>({{1, 2}, {3, 4}})), "PerReplica:{\n  0: [1, 2],\n  1: [3, 4]\n}");
  EXPECT_EQ(str(PerReplica<std::tuple<int, double>>({{1, 2.0}, {3, 4.0}})),
            "PerReplica:{\n  0: (1, 2.0),\n  1: (3, 4.0)\n}");
}

TEST(PerReplica, MultiLineComponentsStayIndented) {
  const std::vector<Tensor<float>> v = {Tensor<float>::scalar(1.0f), Tensor<float>::scalar(2.0f)};
  const PerReplica<std::vector<Tensor<float>>> p({v, v});
  EXPECT_EQ(str(p),
            "PerReplica:{\n"
            "  0: [<Tensor: shape=(), dtype=float32, value=1.0>,\n"
            "   <Tensor: shape=(), dtype=float32, value=2.0>],\n"
            "  1: [<Tensor: shape=(), dtype=float32, value=1.0>,\n"
            "   <Tensor: shape=(), dtype=float32, value=2.0>]\n"
            "}");
}

TEST(PerReplica, ReprIsItsStreamForm) {
  const PerReplica<int> p({1, 2});
  EXPECT_EQ(repr(p), "PerReplica:{\n  0: 1,\n  1: 2\n}");
}

TEST(Mirrored, AccessorsAndPrinting) {
  const Mirrored<int> m({3, 3});
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0], 3);
  EXPECT_EQ(m[1], 3);
  EXPECT_EQ(m.values(), (std::vector<int>{3, 3}));
  EXPECT_EQ(str(m), "Mirrored:{\n  0: 3,\n  1: 3\n}");
  const Mirrored<Tensor<float>> t({Tensor<float>::scalar(6.0f), Tensor<float>::scalar(6.0f)});
  EXPECT_EQ(str(t),
            "Mirrored:{\n"
            "  0: <Tensor: shape=(), dtype=float32, value=6.0>,\n"
            "  1: <Tensor: shape=(), dtype=float32, value=6.0>\n"
            "}");
}

TEST(Mirrored, BadIndexAndEmpty) {
  const Mirrored<int> m({1});
  EXPECT_THROW((void)m[1], OutOfRangeError);
  EXPECT_THROW(Mirrored<int>(std::vector<int>{}), InvalidArgumentError);
}

TEST(DistributedTraits, IsDistributed) {
  static_assert(is_distributed_v<PerReplica<int>>);
  static_assert(is_distributed_v<Mirrored<Tensor<float>>>);
  static_assert(!is_distributed_v<int>);
  static_assert(!is_distributed_v<Tensor<float>>);
  static_assert(!is_distributed_v<std::vector<int>>);
  SUCCEED();
}

}  // namespace
}  // namespace mirrored
