// Zero-copy Eigen views of host tensors (<mirrored/eigen.hpp>).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "mirrored/eigen.hpp"
#include "mirrored/tensor.hpp"
#include "tensor/tensor_test_util.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using namespace mirrored::testing;  // NOLINT: the tensor test helpers

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
