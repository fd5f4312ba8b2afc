// The printed form of Tensor<T> (docs/api.md §2) and its type traits.

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
  EXPECT_EQ(str(Tensor<int64_t>::from_vector({1, 2}, {2, 1})), "<Tensor: shape=(2, 1), dtype=int64, value=[[1], [2]]>");
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
  EXPECT_EQ(str(Tensor<float>::from_vector({1, 2}, {2}, kCpu1)),
            "<Tensor: shape=(2,), dtype=float32, value=[1.0, 2.0]>");
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

TEST(TensorPrint, LargeTensorsAreSummarised) {
  // A million elements print as numpy prints them: a few hundred bytes, not megabytes.
  const std::string text = str(Tensor<float>::zeros({1000, 1000}));
  EXPECT_EQ(text,
            "<Tensor: shape=(1000, 1000), dtype=float32, value=[[0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0], "
            "[0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0], ..., "
            "[0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0], "
            "[0.0, 0.0, 0.0, ..., 0.0, 0.0, 0.0]]>");
}

}  // namespace
}  // namespace mirrored
