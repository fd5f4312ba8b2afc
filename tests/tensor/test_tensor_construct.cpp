// Construction, accessors, reshape, copies and devices of Tensor<T> (docs/api.md §2).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "mirrored/tensor.hpp"
#include "tensor/tensor_test_util.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using namespace mirrored::testing;  // NOLINT: the tensor test helpers

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

// Regression: zeros({1<<32, 1<<32}) got numel 0 (signed overflow) and a
// 1-byte buffer that later reads walked off.
TEST(TensorConstruct, ShapeWhoseSizeOverflowsIsInvalidArgumentNamingIt) {
  constexpr int64_t k32 = int64_t{1} << 32;
  try {
    (void)Tensor<float>::zeros({k32, k32});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("(4294967296, 4294967296)"));
    EXPECT_THAT(e.what(), HasSubstr("too large"));
  }
  // Fits in elements but not in bytes.
  EXPECT_THROW((void)Tensor<double>::empty({int64_t{1} << 61}), InvalidArgumentError);
  EXPECT_THROW((void)Tensor<uint8_t>::full({k32, k32, 2}, 1), InvalidArgumentError);
  EXPECT_THROW((void)Tensor<int32_t>::from_vector({}, {0, k32, k32}), InvalidArgumentError);
  // reshape to a shape that wraps around to the same count is refused, not accepted.
  const Tensor<float> t = Tensor<float>::zeros({0});
  EXPECT_THROW((void)t.reshape({0, k32, k32}), InvalidArgumentError);
  EXPECT_THROW((void)Tensor<float>::zeros({4}).reshape({k32, k32, 4}), InvalidArgumentError);
  // Large but representable empty tensors are fine.
  EXPECT_EQ(Tensor<float>::zeros({0, k32}).numel(), 0);
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

}  // namespace
}  // namespace mirrored
