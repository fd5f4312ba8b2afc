// Element-wise arithmetic of Tensor<T> for every dtype, and casts (docs/api.md §2).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "mirrored/tensor.hpp"
#include "tensor/tensor_test_util.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using namespace mirrored::testing;  // NOLINT: the tensor test helpers

// ---------------------------------------------------------------------------------------------
// Element-wise arithmetic, for every dtype
// ---------------------------------------------------------------------------------------------

template <class T>
class TensorArithmetic : public ::testing::Test {};
using ArithmeticTypes = ::testing::Types<float, double, int32_t, int64_t>;
TYPED_TEST_SUITE(TensorArithmetic, ArithmeticTypes);

TYPED_TEST(TensorArithmetic, TensorOpTensor) {
  using T = TypeParam;
  const Tensor<T> a = Tensor<T>::from_vector({12, 9, -8, 20, 0, 7}, {2, 3});
  const Tensor<T> b = Tensor<T>::from_vector({3, 3, 2, -4, 5, 7}, {2, 3});
  const Tensor<T> sum = a + b, diff = a - b, prod = a * b, quot = a / b;
  for (const auto* r : {&sum, &diff, &prod, &quot}) {
    EXPECT_EQ(r->shape(), Shape({2, 3}));
    EXPECT_EQ(r->device(), cpu0);
  }
  EXPECT_EQ(sum.to_vector(), vec<T>({15, 12, -6, 16, 5, 14}));
  EXPECT_EQ(diff.to_vector(), vec<T>({9, 6, -10, 24, -5, 0}));
  EXPECT_EQ(prod.to_vector(), vec<T>({36, 27, -16, -80, 0, 49}));
  EXPECT_EQ(quot.to_vector(), vec<T>({4, 3, -4, -5, 0, 1}));
  // Operands are unchanged.
  EXPECT_EQ(a.to_vector(), vec<T>({12, 9, -8, 20, 0, 7}));
  EXPECT_EQ(b.to_vector(), vec<T>({3, 3, 2, -4, 5, 7}));
}

TYPED_TEST(TensorArithmetic, ResultIsANewTensor) {
  using T = TypeParam;
  const Tensor<T> a{1, 2};
  const Tensor<T> b{3, 4};
  Tensor<T> c = a + b;
  EXPECT_NE(c.data(), a.data());
  EXPECT_NE(c.data(), b.data());
  c.data()[0] = 100;
  EXPECT_EQ(a.to_vector(), vec<T>({1, 2}));
}

TYPED_TEST(TensorArithmetic, RankZeroBroadcastsEitherSide) {
  using T = TypeParam;
  const Tensor<T> t = Tensor<T>::from_vector({2, 4, 6, 8}, {2, 2});
  const Tensor<T> s = Tensor<T>::scalar(2);
  EXPECT_EQ((t + s).shape(), Shape({2, 2}));
  EXPECT_EQ((t + s).to_vector(), vec<T>({4, 6, 8, 10}));
  EXPECT_EQ((s + t).to_vector(), vec<T>({4, 6, 8, 10}));
  EXPECT_EQ((t - s).to_vector(), vec<T>({0, 2, 4, 6}));
  EXPECT_EQ((s - t).to_vector(), vec<T>({0, -2, -4, -6}));
  EXPECT_EQ((t * s).to_vector(), vec<T>({4, 8, 12, 16}));
  EXPECT_EQ((s * t).shape(), Shape({2, 2}));
  EXPECT_EQ((t / s).to_vector(), vec<T>({1, 2, 3, 4}));
  const Tensor<T> s24 = Tensor<T>::scalar(24);
  EXPECT_EQ((s24 / t).to_vector(), vec<T>({12, 6, 4, 3}));
}

TYPED_TEST(TensorArithmetic, RankZeroWithRankZero) {
  using T = TypeParam;
  const Tensor<T> a = Tensor<T>::scalar(6), b = Tensor<T>::scalar(3);
  EXPECT_EQ((a + b).rank(), 0);
  EXPECT_EQ((a + b).item(), T(9));
  EXPECT_EQ((a - b).item(), T(3));
  EXPECT_EQ((a * b).item(), T(18));
  EXPECT_EQ((a / b).item(), T(2));
}

TYPED_TEST(TensorArithmetic, RankZeroWithEmpty) {
  using T = TypeParam;
  const Tensor<T> e;
  const Tensor<T> s = Tensor<T>::scalar(1);
  EXPECT_EQ((e + s).shape(), Shape({0}));
  EXPECT_EQ((s * e).shape(), Shape({0}));
  EXPECT_EQ((e + e).numel(), 0);
}

TYPED_TEST(TensorArithmetic, NumberOnEitherSide) {
  using T = TypeParam;
  const Tensor<T> t{1, 2, 3, 4};
  EXPECT_EQ((t + 1).to_vector(), vec<T>({2, 3, 4, 5}));
  EXPECT_EQ((1 + t).to_vector(), vec<T>({2, 3, 4, 5}));
  EXPECT_EQ((t - 1).to_vector(), vec<T>({0, 1, 2, 3}));
  EXPECT_EQ((3 - t).to_vector(), vec<T>({2, 1, 0, -1}));
  EXPECT_EQ((t * 3).to_vector(), vec<T>({3, 6, 9, 12}));
  EXPECT_EQ((3 * t).to_vector(), vec<T>({3, 6, 9, 12}));
  EXPECT_EQ((t / 1).to_vector(), vec<T>({1, 2, 3, 4}));
  EXPECT_EQ((12 / t).to_vector(), vec<T>({12, 6, 4, 3}));
  // Other arithmetic types convert to T.
  EXPECT_EQ((t * 2.0).to_vector(), vec<T>({2, 4, 6, 8}));
  EXPECT_EQ((int64_t{10} - t).to_vector(), vec<T>({9, 8, 7, 6}));
  EXPECT_EQ((t + 1).shape(), Shape({4}));
}

TYPED_TEST(TensorArithmetic, NumberKeepsDevice) {
  using T = TypeParam;
  const Tensor<T> t = Tensor<T>::from_vector({2, 4}, {2}, kCpu1);
  const Tensor<T> r = 8 / t;
  EXPECT_EQ(r.device(), kCpu1);
  EXPECT_EQ(r.to_vector(), vec<T>({4, 2}));
  EXPECT_EQ((t - 1).device(), kCpu1);
}

TYPED_TEST(TensorArithmetic, SameDeviceOtherThanCpu0) {
  using T = TypeParam;
  const Tensor<T> a = Tensor<T>::from_vector({1, 2}, {2}, kCpu1);
  const Tensor<T> b = Tensor<T>::from_vector({10, 20}, {2}, kCpu1);
  const Tensor<T> c = a + b;
  EXPECT_EQ(c.device(), kCpu1);
  EXPECT_EQ(c.to_vector(), vec<T>({11, 22}));
}

TYPED_TEST(TensorArithmetic, ShapeMismatchNamesOpAndShapes) {
  using T = TypeParam;
  const Tensor<T> a = Tensor<T>::zeros({2, 2});
  const Tensor<T> b = Tensor<T>::zeros({4});
  const Tensor<T> c = Tensor<T>::zeros({1});
  struct Case {
    const char* op;
    std::function<Tensor<T>()> fn;
  };
  const std::vector<Case> cases = {
      {"add", [&] { return a + b; }},
      {"sub", [&] { return a - b; }},
      {"mul", [&] { return a * b; }},
      {"div", [&] { return a / b; }},
  };
  for (const Case& k : cases) {
    try {
      (void)k.fn();
      ADD_FAILURE() << k.op << ": no exception";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr(k.op));
      EXPECT_THAT(e.what(), HasSubstr("(2, 2)"));
      EXPECT_THAT(e.what(), HasSubstr("(4,)"));
    }
  }
  // A one-element rank-1 tensor does not broadcast (only rank 0 does).
  EXPECT_THROW((void)(b + c), InvalidArgumentError);
}

TYPED_TEST(TensorArithmetic, DeviceMismatchNamesBothDevices) {
  using T = TypeParam;
  const Tensor<T> a{1, 2};
  const Tensor<T> b = Tensor<T>::from_vector({1, 2}, {2}, kCpu1);
  try {
    (void)(a * b);
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("mul"));
    EXPECT_THAT(e.what(), HasSubstr("CPU:0"));
    EXPECT_THAT(e.what(), HasSubstr("CPU:1"));
  }
  // Even a rank-0 operand must be on the same device.
  EXPECT_THROW((void)(a + Tensor<T>::scalar(1, kCpu1)), InvalidArgumentError);
}

TEST(TensorArithmeticExact, IntegerDivisionTruncatesTowardZero) {
  const Tensor<int32_t> a{7, -7, 7, -7};
  const Tensor<int32_t> b{2, 2, -2, -2};
  EXPECT_EQ((a / b).to_vector(), vec<int32_t>({3, -3, -3, 3}));
  EXPECT_EQ((Tensor<int64_t>{9, -9} / 4).to_vector(), vec<int64_t>({2, -2}));
}

TEST(TensorArithmeticExact, FloatDivisionIsExactForExactQuotients) {
  EXPECT_EQ((Tensor<float>{1.0f, 3.0f} / 2).to_vector(), vec({0.5f, 1.5f}));
  EXPECT_EQ((Tensor<double>{1.0, -3.0} / 4.0).to_vector(), vec({0.25, -0.75}));
}

TEST(TensorArithmeticExact, IntegerDivisionByZeroIsInvalidArgument) {
  const Tensor<int32_t> a{1, 2};
  const Tensor<int32_t> z{1, 0};
  try {
    (void)(a / z);
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("division by zero"));
  }
  EXPECT_THROW((void)(Tensor<int64_t>{5} / 0), InvalidArgumentError);
  EXPECT_THROW((void)(7 / Tensor<int64_t>{1, 0}), InvalidArgumentError);
}

// INT_MIN / -1 overflows; it must not kill the process (x86 raises SIGFPE for it). numpy returns
// INT_MIN (with an overflow warning); a library error is acceptable too. Run in a child process
// so that a crash fails only this test.
template <class T>
[[noreturn]] void DivideMinByMinusOneAndExit() {
  bool ok = false;
  try {
    const Tensor<T> a{std::numeric_limits<T>::min(), 6};
    const Tensor<T> b{-1, -1};
    const std::vector<T> r = (a / b).to_vector();
    ok = r[0] == std::numeric_limits<T>::min() && r[1] == -6;
  } catch (const Error&) {
    ok = true;
  }
  std::exit(ok ? 0 : 1);
}

template <class T>
void ExpectMinByMinusOneDoesNotCrash() {
  const std::string saved_style = ::testing::GTEST_FLAG(death_test_style);
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_EXIT(DivideMinByMinusOneAndExit<T>(), ::testing::ExitedWithCode(0), "");
  ::testing::GTEST_FLAG(death_test_style) = saved_style;
}

TEST(TensorArithmeticExact, Int32MinDividedByMinusOneDoesNotCrash) { ExpectMinByMinusOneDoesNotCrash<int32_t>(); }
TEST(TensorArithmeticExact, Int64MinDividedByMinusOneDoesNotCrash) { ExpectMinByMinusOneDoesNotCrash<int64_t>(); }

TEST(TensorArithmeticExact, FloatDivisionByZeroIsInf) {
  const std::vector<float> r = (Tensor<float>{1.0f, -1.0f} / 0.0f).to_vector();
  EXPECT_EQ(r[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(r[1], -std::numeric_limits<float>::infinity());
}

TEST(TensorArithmeticExact, Uint8Arithmetic) {
  const Tensor<uint8_t> a{10, 200};
  EXPECT_EQ((a + Tensor<uint8_t>{5, 50}).to_vector(), vec<uint8_t>({15, 250}));
  EXPECT_EQ((a / 10).to_vector(), vec<uint8_t>({1, 20}));
}

TEST(TensorArithmeticExact, ChainedExpression) {
  const Tensor<double> x = Tensor<double>::from_vector({1, 2, 3, 4}, {2, 2});
  const Tensor<double> y = (x * x + 1) * 2 - x / 0.5;
  EXPECT_EQ(y.to_vector(), vec<double>({2, 6, 14, 26}));
}

// ---------------------------------------------------------------------------------------------
// cast
// ---------------------------------------------------------------------------------------------

TEST(TensorCast, IntToDouble) {
  const Tensor<int32_t> t = Tensor<int32_t>::from_vector({1, -2, 3, 2147483647}, {2, 2}, kCpu1);
  const Tensor<double> d = cast<double>(t);
  EXPECT_EQ(d.dtype(), DType::float64);
  EXPECT_EQ(d.shape(), Shape({2, 2}));
  EXPECT_EQ(d.device(), kCpu1);
  EXPECT_EQ(d.to_vector(), vec<double>({1, -2, 3, 2147483647.0}));
}

TEST(TensorCast, FloatToIntTruncates) {
  const Tensor<float> t{1.5f, -1.5f, 2.75f, -2.75f, 0.25f, 7.0f};
  const Tensor<int32_t> i = cast<int32_t>(t);
  EXPECT_EQ(i.dtype(), DType::int32);
  EXPECT_EQ(i.to_vector(), vec<int32_t>({1, -1, 2, -2, 0, 7}));
}

TEST(TensorCast, OtherPairs) {
  EXPECT_EQ(cast<float>(Tensor<int64_t>{-3, 4}).to_vector(), vec({-3.0f, 4.0f}));
  EXPECT_EQ(cast<int64_t>(Tensor<double>{-3.5, 4.5}).to_vector(), vec<int64_t>({-3, 4}));
  EXPECT_EQ(cast<float>(Tensor<uint8_t>{0, 255}).to_vector(), vec({0.0f, 255.0f}));
  EXPECT_EQ(cast<double>(Tensor<float>::scalar(0.5f)).rank(), 0);
  EXPECT_EQ(cast<double>(Tensor<float>()).shape(), Shape({0}));
}

TEST(TensorCast, SameTypeSharesStorage) {
  Tensor<float> t{1.0f, 2.0f};
  Tensor<float> u = cast<float>(t);
  EXPECT_EQ(u.data(), t.data());
}

TEST(TensorCast, DifferentTypeIsIndependent) {
  Tensor<int32_t> t{1, 2};
  Tensor<double> d = cast<double>(t);
  t.data()[0] = 50;
  EXPECT_EQ(d.to_vector(), vec<double>({1, 2}));
}

}  // namespace
}  // namespace mirrored
