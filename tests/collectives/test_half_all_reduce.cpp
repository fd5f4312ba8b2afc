// All-reduce of float16 and bfloat16 tensors through both CPU cross-device ops, for 1, 2 and 4
// replicas: sums accumulate in float in replica order and round once; MEAN divides in float.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "collectives/replicas_and_ops.hpp"
#include "harness.hpp"
#include "mirrored/half.hpp"

namespace mirrored {
namespace {

using testing::cpus;

using testing::Ops;

class HalfAllReduceTest : public testing::ReplicasAndOps {};

template <class H>
std::vector<float> floats(const Tensor<H>& t) {
  std::vector<float> out;
  for (H v : t.to_vector()) out.push_back(static_cast<float>(v));
  return out;
}

// Replica r holds {r == 0 ? big : 1, r + 1, -r / 2, large}. `big` (2048 for float16, 256 for
// bfloat16) is the first integer whose successor the type cannot hold: adding the ones one at a
// time in the 2-byte type would stay at `big`; in float they add up before the one rounding.
// `large` times the replica count overflows float16 (65504 * 2), but its mean does not.
template <class H>
void check_sum_and_mean(HalfAllReduceTest& t, float big, float large) {
  auto s = t.make();
  const int n = t.n();
  auto out = s->run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    const auto x = Tensor<H>::from_vector({H(r == 0 ? big : 1.0f), H(float(r + 1)), H(-0.5f * r), H(large)}, {4});
    ReplicaContext* ctx = get_replica_context();
    return std::make_pair(ctx->all_reduce(ReduceOp::SUM, x), ctx->all_reduce(ReduceOp::MEAN, x));
  });
  // Every partial sum below is exact in float.
  const float sums[4] = {big + float(n - 1), float(n * (n + 1) / 2), -0.25f * float(n * (n - 1)),
                         float(H(large)) * float(n)};
  std::vector<float> want_sum, want_mean;
  for (float v : sums) {
    want_sum.push_back(float(H(v)));
    want_mean.push_back(float(H(v / float(n))));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r].first.dtype(), dtype_of<H>());
    EXPECT_EQ(floats(out[r].first), want_sum) << "SUM, replica " << r;
    EXPECT_EQ(floats(out[r].second), want_mean) << "MEAN, replica " << r;
  }
}

TEST_P(HalfAllReduceTest, Float16SumAndMean) {
  check_sum_and_mean<float16>(*this, 2048.0f, 65504.0f);
  // The values spelled out for 4 replicas: 2051 rounds (tie) to 2052; 65504 * 4 overflows; the
  // mean of four 65504s is 65504.
  if (n() == 4) {
    auto s = make();
    auto out = s->run([] {
      const int r = id();
      const auto x = Tensor<float16>::from_vector({float16(r == 0 ? 2048.0f : 1.0f), float16(65504.0f)}, {2});
      return std::make_pair(get_replica_context()->all_reduce(ReduceOp::SUM, x),
                            get_replica_context()->all_reduce(ReduceOp::MEAN, x));
    });
    EXPECT_EQ(floats(out[0].first), (std::vector<float>{2052.0f, std::numeric_limits<float>::infinity()}));
    EXPECT_EQ(floats(out[0].second), (std::vector<float>{513.0f, 65504.0f}));
  }
}

TEST_P(HalfAllReduceTest, BFloat16SumAndMean) {
  check_sum_and_mean<bfloat16>(*this, 256.0f, 1e37f);
  if (n() == 4) {
    auto s = make();
    auto out = s->run([] {
      const auto x = Tensor<bfloat16>::from_vector({bfloat16(id() == 0 ? 256.0f : 1.0f)}, {1});
      return get_replica_context()->all_reduce(ReduceOp::SUM, x);
    });
    EXPECT_EQ(floats(out[0]), (std::vector<float>{260.0f}));  // 259 rounds (tie) to 260
  }
}

TEST_P(HalfAllReduceTest, LargeOddSizedBuffersAndMixedDtypesAreExact) {
  auto s = make();
  constexpr int64_t kCount = 100003;  // spans several blocks and replica slices, not a multiple of either
  const int replicas = n(), ids = n() * (n() - 1) / 2;
  auto out = s->run([&] {
    const int r = id();
    auto h = Tensor<float16>::empty({kCount});
    auto b = Tensor<bfloat16>::empty({kCount});
    auto f = Tensor<float>::empty({kCount});
    for (int64_t i = 0; i < kCount; ++i) {
      h.data()[i] = float16(float((i % 100) + r));
      b.data()[i] = bfloat16(float((i % 50) + r));
      f.data()[i] = float(i % 1000);
    }
    auto [sh, sb, sf] = get_replica_context()->all_reduce(ReduceOp::SUM, std::make_tuple(h, b, f));
    int64_t wrong = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      wrong += float(sh.data()[i]) != float(replicas * (i % 100) + ids);
      wrong += float(sb.data()[i]) != float(bfloat16(float(replicas * (i % 50) + ids)));
      wrong += sf.data()[i] != float(replicas * (i % 1000));
    }
    return wrong;
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], 0) << "replica " << r;
}

INSTANTIATE_TEST_SUITE_P(Replicas, HalfAllReduceTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(Ops::InProcess, Ops::ToOneDevice)),
                         testing::replicas_and_ops_name);

}  // namespace
}  // namespace mirrored
