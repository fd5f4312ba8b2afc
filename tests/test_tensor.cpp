// Unit tests for Tensor<T> (API contract §2): construction, accessors, copies, devices,
// element-wise arithmetic, casts, printing and the Eigen views.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/eigen.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;

const Device kCpu1(DeviceType::CPU, 1);

template <class T>
std::string str(const Tensor<T>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

template <class T>
std::vector<T> vec(std::initializer_list<T> v) {
  return std::vector<T>(v);
}

// ---------------------------------------------------------------------------------------------
// Construction and accessors
// ---------------------------------------------------------------------------------------------

TEST(TensorConstruct, InitializerListIsRank1OnCpu0) {
  const Tensor<float> t{1.0f, 2.0f, 3.0f};
  EXPECT_EQ(t.shape(), Shape({3}));
  EXPECT_EQ(t.rank(), 1);
  EXPECT_EQ(t.numel(), 3);
  EXPECT_EQ(t.device(), cpu0);
  EXPECT_EQ(t.dtype(), DType::float32);
  EXPECT_EQ(t.bytes(), 12u);
  EXPECT_EQ(t.to_vector(), vec({1.0f, 2.0f, 3.0f}));
}

TEST(TensorConstruct, InitializerListOfEachDtype) {
  EXPECT_EQ((Tensor<double>{1.0, -2.0}).to_vector(), vec({1.0, -2.0}));
  EXPECT_EQ((Tensor<int32_t>{1, -2, 3}).to_vector(), vec<int32_t>({1, -2, 3}));
  EXPECT_EQ((Tensor<int64_t>{4000000000LL, -5}).to_vector(), vec<int64_t>({4000000000LL, -5}));
  EXPECT_EQ((Tensor<uint8_t>{0, 255}).to_vector(), vec<uint8_t>({0, 255}));
  EXPECT_EQ(Tensor<double>::dtype(), DType::float64);
  EXPECT_EQ(Tensor<int32_t>::dtype(), DType::int32);
  EXPECT_EQ(Tensor<int64_t>::dtype(), DType::int64);
  EXPECT_EQ(Tensor<uint8_t>::dtype(), DType::uint8);
}

TEST(TensorConstruct, SingleElementInitializerListIsRank1) {
  const Tensor<int64_t> t{7};
  EXPECT_EQ(t.shape(), Shape({1}));
  EXPECT_EQ(t.item(), 7);
}

TEST(TensorConstruct, Scalar) {
  const Tensor<float> t = Tensor<float>::scalar(6.0f);
  EXPECT_EQ(t.shape(), Shape{});
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.device(), cpu0);
  EXPECT_EQ(t.item(), 6.0f);
  EXPECT_EQ(t.to_vector(), vec({6.0f}));
}

TEST(TensorConstruct, ScalarOnAnotherCpu) {
  const Tensor<int32_t> t = Tensor<int32_t>::scalar(-4, kCpu1);
  EXPECT_EQ(t.device(), kCpu1);
  EXPECT_EQ(t.item(), -4);
}

TEST(TensorConstruct, FromVectorWithShape) {
  const Tensor<int32_t> t = Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.device(), cpu0);
  EXPECT_EQ(t.to_vector(), vec<int32_t>({1, 2, 3, 4, 5, 6}));
  // Row-major element access through data().
  EXPECT_EQ(t.data()[1 * 3 + 2], 6);
}

TEST(TensorConstruct, FromVectorRank3AndDevice) {
  const Tensor<double> t = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}, kCpu1);
  EXPECT_EQ(t.shape(), Shape({2, 2, 2}));
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.numel(), 8);
  EXPECT_EQ(t.device(), kCpu1);
  EXPECT_EQ(t.to_vector(), vec<double>({1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(TensorConstruct, FromVectorRank0) {
  const Tensor<int64_t> t = Tensor<int64_t>::from_vector({9}, {});
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.item(), 9);
}

TEST(TensorConstruct, FromVectorWithZeroSizedDims) {
  const Tensor<float> a = Tensor<float>::from_vector({}, {0});
  EXPECT_EQ(a.numel(), 0);
  EXPECT_TRUE(a.to_vector().empty());
  const Tensor<float> b = Tensor<float>::from_vector({}, {2, 0, 3});
  EXPECT_EQ(b.shape(), Shape({2, 0, 3}));
  EXPECT_EQ(b.rank(), 3);
  EXPECT_EQ(b.numel(), 0);
}

TEST(TensorConstruct, FromVectorSizeMismatchNamesBothCounts) {
  try {
    (void)Tensor<float>::from_vector({1, 2, 3}, {2, 2});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 values"));
    EXPECT_THAT(e.what(), HasSubstr("(2, 2)"));
    EXPECT_THAT(e.what(), HasSubstr("4 elements"));
  }
  try {
    (void)Tensor<int32_t>::from_vector({1, 2}, {});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 values"));
    EXPECT_THAT(e.what(), HasSubstr("1 elements"));
  }
}

TEST(TensorConstruct, NegativeDimensionIsInvalidArgument) {
  EXPECT_THROW((void)Tensor<float>::from_vector({}, {-1}), InvalidArgumentError);
  EXPECT_THROW((void)Tensor<float>::zeros({2, -3}), InvalidArgumentError);
}

TEST(TensorConstruct, Zeros) {
  const Tensor<double> t = Tensor<double>::zeros({2, 3});
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(t.to_vector(), std::vector<double>(6, 0.0));
  const Tensor<int64_t> s = Tensor<int64_t>::zeros({});
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.item(), 0);
  const Tensor<int32_t> e = Tensor<int32_t>::zeros({0});
  EXPECT_EQ(e.numel(), 0);
  const Tensor<float> c1 = Tensor<float>::zeros({4}, kCpu1);
  EXPECT_EQ(c1.device(), kCpu1);
  EXPECT_EQ(c1.to_vector(), std::vector<float>(4, 0.0f));
}

TEST(TensorConstruct, Full) {
  const Tensor<float> t = Tensor<float>::full({3, 1}, 7.0f);
  EXPECT_EQ(t.shape(), Shape({3, 1}));
  EXPECT_EQ(t.to_vector(), vec({7.0f, 7.0f, 7.0f}));
  const Tensor<uint8_t> u = Tensor<uint8_t>::full({2}, 200);
  EXPECT_EQ(u.to_vector(), vec<uint8_t>({200, 200}));
  const Tensor<int64_t> s = Tensor<int64_t>::full({}, -5, kCpu1);
  EXPECT_EQ(s.item(), -5);
  EXPECT_EQ(s.device(), kCpu1);
}

TEST(TensorConstruct, EmptyDefault) {
  const Tensor<float> t;
  EXPECT_EQ(t.shape(), Shape({0}));
  EXPECT_EQ(t.rank(), 1);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.device(), cpu0);
  EXPECT_EQ(t.bytes(), 0u);
  EXPECT_TRUE(t.to_vector().empty());
  EXPECT_EQ(str(t), "<Tensor: shape=(0,), dtype=float32, value=[]>");
}

TEST(TensorConstruct, EmptyFactoryHasShape) {
  Tensor<int32_t> t = Tensor<int32_t>::empty({2, 2});
  EXPECT_EQ(t.shape(), Shape({2, 2}));
  EXPECT_EQ(t.numel(), 4);
  for (int i = 0; i < 4; ++i) t.data()[i] = i;
  EXPECT_EQ(t.to_vector(), vec<int32_t>({0, 1, 2, 3}));
}

TEST(TensorAccess, ItemOnOneElement) {
  EXPECT_EQ(Tensor<float>::scalar(2.0f).item(), 2.0f);
  EXPECT_EQ((Tensor<double>{3.0}).item(), 3.0);
  EXPECT_EQ(Tensor<int32_t>::from_vector({8}, {1, 1, 1}).item(), 8);
}

TEST(TensorAccess, ItemOtherwiseIsInvalidArgument) {
  try {
    (void)(Tensor<float>{1.0f, 2.0f}).item();
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(2,)"));
    EXPECT_THAT(e.what(), HasSubstr("2 elements"));
  }
  try {
    (void)Tensor<int32_t>().item();
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(0,)"));
    EXPECT_THAT(e.what(), HasSubstr("0 elements"));
  }
}

TEST(TensorAccess, ToVectorIsACopy) {
  Tensor<int32_t> t{1, 2, 3};
  std::vector<int32_t> v = t.to_vector();
  v[0] = 100;
  EXPECT_EQ(t.to_vector(), vec<int32_t>({1, 2, 3}));
}

TEST(TensorAccess, DataWritesAreVisible) {
  Tensor<double> t = Tensor<double>::zeros({2, 2});
  t.data()[3] = 5.0;
  EXPECT_EQ(t.to_vector(), vec<double>({0, 0, 0, 5}));
}

// ---------------------------------------------------------------------------------------------
// reshape, copies, clone, to()
// ---------------------------------------------------------------------------------------------

TEST(TensorReshape, NewShapeSameValues) {
  const Tensor<int32_t> t = Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor<int32_t> r = t.reshape({3, 2});
  EXPECT_EQ(r.shape(), Shape({3, 2}));
  EXPECT_EQ(r.to_vector(), vec<int32_t>({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.shape(), Shape({2, 3}));  // the original keeps its shape
  EXPECT_EQ(t.reshape({6}).shape(), Shape({6}));
  EXPECT_EQ(Tensor<float>{4.0f}.reshape({}).rank(), 0);
  EXPECT_EQ(Tensor<float>::scalar(4.0f).reshape({1, 1}).shape(), Shape({1, 1}));
}

TEST(TensorReshape, SharesStorage) {
  Tensor<float> t = Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor<float> r = t.reshape({4});
  EXPECT_EQ(r.data(), t.data());
  r.data()[0] = 10.0f;
  EXPECT_EQ(t.to_vector(), vec({10.0f, 2.0f, 3.0f, 4.0f}));
  t.data()[3] = 40.0f;
  EXPECT_EQ(r.to_vector(), vec({10.0f, 2.0f, 3.0f, 40.0f}));
}

TEST(TensorReshape, ErrorNamesBothShapes) {
  const Tensor<float> t = Tensor<float>::zeros({2, 2});
  try {
    (void)t.reshape({3});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(2, 2)"));
    EXPECT_THAT(e.what(), HasSubstr("(3,)"));
  }
}

TEST(TensorCopy, CopySharesStorage) {
  Tensor<int64_t> a{1, 2, 3};
  Tensor<int64_t> b = a;
  EXPECT_EQ(b.data(), a.data());
  b.data()[1] = 20;
  EXPECT_EQ(a.to_vector(), vec<int64_t>({1, 20, 3}));
  Tensor<int64_t> c;
  c = a;
  c.data()[2] = 30;
  EXPECT_EQ(a.to_vector(), vec<int64_t>({1, 20, 30}));
}

TEST(TensorCopy, CloneIsIndependent) {
  Tensor<int64_t> a = Tensor<int64_t>::from_vector({1, 2, 3, 4}, {2, 2}, kCpu1);
  Tensor<int64_t> b = a.clone();
  EXPECT_NE(b.data(), a.data());
  EXPECT_EQ(b.shape(), a.shape());
  EXPECT_EQ(b.device(), a.device());
  EXPECT_EQ(b.to_vector(), a.to_vector());
  b.data()[0] = 100;
  EXPECT_EQ(a.to_vector(), vec<int64_t>({1, 2, 3, 4}));
  a.data()[3] = 400;
  EXPECT_EQ(b.to_vector(), vec<int64_t>({100, 2, 3, 4}));
}

TEST(TensorCopy, CloneOfEmpty) {
  const Tensor<float> a;
  const Tensor<float> b = a.clone();
  EXPECT_EQ(b.shape(), Shape({0}));
  EXPECT_EQ(b.numel(), 0);
}

TEST(TensorTo, ChangesDeviceAndCopies) {
  Tensor<float> a = Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor<float> b = a.to(kCpu1);
  EXPECT_EQ(b.device(), kCpu1);
  EXPECT_EQ(b.device().to_string(), "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(a.device(), cpu0);
  EXPECT_EQ(b.shape(), Shape({2, 2}));
  EXPECT_EQ(b.to_vector(), vec({1.0f, 2.0f, 3.0f, 4.0f}));
  b.data()[0] = 9.0f;
  EXPECT_EQ(a.to_vector()[0], 1.0f);
  // Back again, and onto the same device (always a new storage).
  Tensor<float> c = b.to(cpu0);
  EXPECT_EQ(c.device(), cpu0);
  EXPECT_EQ(c.to_vector(), vec({9.0f, 2.0f, 3.0f, 4.0f}));
  Tensor<float> d = a.to(cpu0);
  EXPECT_NE(d.data(), a.data());
  EXPECT_EQ(d.to_vector(), a.to_vector());
}

TEST(TensorTo, ReshapeAndCloneKeepDevice) {
  const Tensor<int32_t> a = Tensor<int32_t>::from_vector({1, 2}, {2}, kCpu1);
  EXPECT_EQ(a.reshape({1, 2}).device(), kCpu1);
  EXPECT_EQ(a.clone().device(), kCpu1);
}

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

// ---------------------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------------------

TEST(TensorPrint, Float32Vector) {
  EXPECT_EQ(str(Tensor<float>{1.0f, 2.0f}), "<Tensor: shape=(2,), dtype=float32, value=[1.0, 2.0]>");
}

TEST(TensorPrint, Scalars) {
  EXPECT_EQ(str(Tensor<float>::scalar(6.0f)), "<Tensor: shape=(), dtype=float32, value=6.0>");
  EXPECT_EQ(str(Tensor<double>::scalar(-0.5)), "<Tensor: shape=(), dtype=float64, value=-0.5>");
  EXPECT_EQ(str(Tensor<int32_t>::scalar(6)), "<Tensor: shape=(), dtype=int32, value=6>");
  EXPECT_EQ(str(Tensor<int64_t>::scalar(-12)), "<Tensor: shape=(), dtype=int64, value=-12>");
}

TEST(TensorPrint, Ints) {
  EXPECT_EQ(str(Tensor<int32_t>{1, -2, 3}), "<Tensor: shape=(3,), dtype=int32, value=[1, -2, 3]>");
  EXPECT_EQ(str(Tensor<int64_t>{4000000000LL}), "<Tensor: shape=(1,), dtype=int64, value=[4000000000]>");
}

TEST(TensorPrint, Rank2) {
  EXPECT_EQ(str(Tensor<int32_t>::from_vector({1, 2, 3, 4}, {2, 2})),
            "<Tensor: shape=(2, 2), dtype=int32, value=[[1, 2], [3, 4]]>");
  EXPECT_EQ(str(Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {3, 2})),
            "<Tensor: shape=(3, 2), dtype=float32, value=[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]>");
  EXPECT_EQ(str(Tensor<int64_t>::from_vector({1, 2}, {2, 1})),
            "<Tensor: shape=(2, 1), dtype=int64, value=[[1], [2]]>");
}

TEST(TensorPrint, Rank3) {
  EXPECT_EQ(str(Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2})),
            "<Tensor: shape=(2, 2, 2), dtype=int32, value=[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]>");
}

TEST(TensorPrint, Empty) {
  EXPECT_EQ(str(Tensor<float>::zeros({0})), "<Tensor: shape=(0,), dtype=float32, value=[]>");
  EXPECT_EQ(str(Tensor<int32_t>::zeros({0, 3})), "<Tensor: shape=(0, 3), dtype=int32, value=[]>");
  EXPECT_EQ(str(Tensor<int32_t>::zeros({2, 0})), "<Tensor: shape=(2, 0), dtype=int32, value=[[], []]>");
}

TEST(TensorPrint, Uint8) {
  EXPECT_EQ(str(Tensor<uint8_t>{0, 7, 255}), "<Tensor: shape=(3,), dtype=uint8, value=[0, 7, 255]>");
}

TEST(TensorPrint, Float64) {
  EXPECT_EQ(str(Tensor<double>{1.0, 0.5, -2.0}), "<Tensor: shape=(3,), dtype=float64, value=[1.0, 0.5, -2.0]>");
  EXPECT_EQ(str(Tensor<double>{0.1}), "<Tensor: shape=(1,), dtype=float64, value=[0.1]>");
}

TEST(TensorPrint, Float32ShortestDigits) {
  // numpy: np.float32(0.1) prints 0.1 (not 0.10000000149011612).
  EXPECT_EQ(str(Tensor<float>{0.1f}), "<Tensor: shape=(1,), dtype=float32, value=[0.1]>");
  EXPECT_EQ(str(Tensor<float>::scalar(0.1f)), "<Tensor: shape=(), dtype=float32, value=0.1>");
  EXPECT_EQ(str(Tensor<float>{3.14159f, 100.0f}), "<Tensor: shape=(2,), dtype=float32, value=[3.14159, 100.0]>");
}

TEST(TensorPrint, OnAnotherDeviceSameText) {
  EXPECT_EQ(str(Tensor<float>::from_vector({1, 2}, {2}, kCpu1)), "<Tensor: shape=(2,), dtype=float32, value=[1.0, 2.0]>");
}

TEST(TensorPrint, DtypeNames) {
  EXPECT_STREQ(dtype_name(DType::float32), "float32");
  EXPECT_STREQ(dtype_name(DType::float64), "float64");
  EXPECT_STREQ(dtype_name(DType::int32), "int32");
  EXPECT_STREQ(dtype_name(DType::int64), "int64");
  EXPECT_STREQ(dtype_name(DType::uint8), "uint8");
  EXPECT_EQ(dtype_size(DType::float32), 4u);
  EXPECT_EQ(dtype_size(DType::float64), 8u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::int64), 8u);
  EXPECT_EQ(dtype_size(DType::uint8), 1u);
  EXPECT_TRUE(dtype_is_floating(DType::float32));
  EXPECT_TRUE(dtype_is_floating(DType::float64));
  EXPECT_FALSE(dtype_is_floating(DType::int32));
  EXPECT_FALSE(dtype_is_floating(DType::uint8));
}

TEST(TensorTraits, IsTensor) {
  static_assert(is_tensor_v<Tensor<float>>);
  static_assert(is_tensor_v<Tensor<uint8_t>>);
  static_assert(!is_tensor_v<float>);
  static_assert(!is_tensor_v<std::vector<float>>);
  static_assert(dtype_of<float>() == DType::float32);
  static_assert(dtype_of<int64_t>() == DType::int64);
  SUCCEED();
}

// ---------------------------------------------------------------------------------------------
// Eigen views
// ---------------------------------------------------------------------------------------------

TEST(TensorEigen, AsVectorMapsTheSameMemory) {
  Tensor<float> t = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto v = as_vector(t);
  EXPECT_EQ(v.size(), 6);
  EXPECT_EQ(v.data(), t.data());
  EXPECT_EQ(v(0), 1.0f);
  EXPECT_EQ(v(5), 6.0f);
  EXPECT_EQ(v.sum(), 21.0f);
  v(2) = 30.0f;
  v *= 2.0f;
  EXPECT_EQ(t.to_vector(), vec({2.0f, 4.0f, 60.0f, 8.0f, 10.0f, 12.0f}));
}

TEST(TensorEigen, AsVectorConst) {
  const Tensor<int64_t> t{1, 2, 3};
  auto v = as_vector(t);
  EXPECT_EQ(v.size(), 3);
  EXPECT_EQ(v.data(), t.data());
  EXPECT_EQ(v.sum(), 6);
}

TEST(TensorEigen, AsMatrixIsRowMajor) {
  Tensor<double> t = Tensor<double>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  auto m = as_matrix(t);
  EXPECT_EQ(m.rows(), 2);
  EXPECT_EQ(m.cols(), 3);
  EXPECT_EQ(m.data(), t.data());
  EXPECT_EQ(m(0, 0), 1.0);
  EXPECT_EQ(m(0, 2), 3.0);
  EXPECT_EQ(m(1, 0), 4.0);
  EXPECT_EQ(m(1, 2), 6.0);
  m(1, 1) = 50.0;
  EXPECT_EQ(t.to_vector(), vec<double>({1, 2, 3, 4, 50, 6}));
  // Eigen math on the view writes through.
  m.row(0) *= 10.0;
  EXPECT_EQ(t.to_vector(), vec<double>({10, 20, 30, 4, 50, 6}));
  const RowMatrix<double> mt = m.transpose();
  EXPECT_EQ(mt(2, 0), 30.0);
  EXPECT_EQ(mt(1, 1), 50.0);
}

TEST(TensorEigen, AsMatrixConstAndProduct) {
  const Tensor<int32_t> a = Tensor<int32_t>::from_vector({1, 2, 3, 4}, {2, 2});
  const Tensor<int32_t> b = Tensor<int32_t>::from_vector({5, 6, 7, 8}, {2, 2});
  const RowMatrix<int32_t> c = as_matrix(a) * as_matrix(b);
  EXPECT_EQ(c(0, 0), 19);
  EXPECT_EQ(c(0, 1), 22);
  EXPECT_EQ(c(1, 0), 43);
  EXPECT_EQ(c(1, 1), 50);
}

TEST(TensorEigen, AsMatrixOnAnotherCpuDevice) {
  Tensor<float> t = Tensor<float>::from_vector({1, 2}, {1, 2}, kCpu1);
  auto m = as_matrix(t);
  m(0, 1) = 7.0f;
  EXPECT_EQ(t.to_vector(), vec({1.0f, 7.0f}));
}

TEST(TensorEigen, AsMatrixRankError) {
  Tensor<float> r1{1.0f, 2.0f};
  try {
    (void)as_matrix(r1);
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(2,)"));
    EXPECT_THAT(e.what(), HasSubstr("rank 2"));
  }
  const Tensor<float> r3 = Tensor<float>::zeros({1, 2, 2});
  EXPECT_THROW((void)as_matrix(r3), InvalidArgumentError);
  Tensor<float> r0 = Tensor<float>::scalar(1.0f);
  EXPECT_THROW((void)as_matrix(r0), InvalidArgumentError);
}

}  // namespace
}  // namespace mirrored
