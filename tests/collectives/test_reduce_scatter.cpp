// ReplicaContext::reduce_scatter and reduce_scatter_async through both CPU cross-device ops, for
// 1, 2, 3, 4 and 8 replicas: the BALANCED cut of the rows, every dtype and op, agreement with
// all_reduce bit for bit, and the mismatches every collective rejects.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/replicas_and_ops.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::message_of;

class ReduceScatterTest : public testing::ReplicasAndOps {
 public:
  // Rows [begin, end) of replica r's slice of `rows` rows (the BALANCED rule, by hand).
  std::pair<int64_t, int64_t> rows_of(int64_t rows, int r) const {
    const int64_t floor = rows / n(), extra = rows % n();
    const int64_t begin = r * floor + std::min<int64_t>(r, extra);
    return {begin, begin + floor + (r < extra ? 1 : 0)};
  }
};

// Replica r's value: element (i, j) is 10 * i + j + r (integer-valued, so every sum is exact).
template <class T>
Tensor<T> ramp(int64_t rows, int64_t cols, int r) {
  std::vector<T> v;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v.push_back(static_cast<T>(10 * i + j + r));
  return Tensor<T>::from_vector(v, {rows, cols});
}

template <class T>
void check_ramp_sum(ReduceScatterTest& t, int64_t rows, int64_t cols, ReduceOp op) {
  auto s = t.make();
  const int n = t.n();
  auto out = s->run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    return get_replica_context()->reduce_scatter(op, ramp<T>(rows, cols, r));
  });
  const int64_t ids = int64_t{n} * (n - 1) / 2;
  for (int r = 0; r < n; ++r) {
    const auto [begin, end] = t.rows_of(rows, r);
    ASSERT_EQ(out[r].shape(), (Shape{end - begin, cols})) << "replica " << r;
    const std::vector<T> got = out[r].to_vector();
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const double sum = double(n) * double(10 * i + j) + double(ids);
        const double want = op == ReduceOp::SUM ? sum : sum / n;
        EXPECT_EQ(static_cast<double>(got[static_cast<std::size_t>((i - begin) * cols + j)]),
                  static_cast<double>(static_cast<T>(want)))
            << "replica " << r << " row " << i << " col " << j;
      }
    }
  }
}

TEST_P(ReduceScatterTest, EveryReplicaGetsItsBalancedRowsOfTheSum) {
  // 7 rows: uneven for 2, 3, 4 and 8 replicas (8: the last replica gets no row).
  check_ramp_sum<float>(*this, 7, 3, ReduceOp::SUM);
  check_ramp_sum<float>(*this, 7, 3, ReduceOp::MEAN);
}

TEST_P(ReduceScatterTest, EveryDtype) {
  check_ramp_sum<double>(*this, 5, 2, ReduceOp::SUM);
  check_ramp_sum<double>(*this, 5, 2, ReduceOp::MEAN);
  check_ramp_sum<int32_t>(*this, 9, 1, ReduceOp::SUM);
  check_ramp_sum<int64_t>(*this, 3, 4, ReduceOp::SUM);
  check_ramp_sum<uint8_t>(*this, 2, 2, ReduceOp::SUM);
  check_ramp_sum<float16>(*this, 6, 2, ReduceOp::SUM);
  check_ramp_sum<float16>(*this, 6, 2, ReduceOp::MEAN);
  check_ramp_sum<bfloat16>(*this, 4, 3, ReduceOp::SUM);
}

TEST_P(ReduceScatterTest, RankOneAndHigherRanksCutAlongTheFirstAxis) {
  auto s = make();
  const int n = this->n();
  auto out = s->run([&] {
    auto* ctx = get_replica_context();
    const float r = static_cast<float>(ctx->replica_id_in_sync_group());
    Tensor<float> v = Tensor<float>::from_vector({r, r, r, r, r}, {5});
    Tensor<float> cube = Tensor<float>::full({3, 2, 2}, 1.0f);
    return std::make_pair(ctx->reduce_scatter(ReduceOp::SUM, v), ctx->reduce_scatter(ReduceOp::SUM, cube));
  });
  const float ids = float(n * (n - 1) / 2);
  for (int r = 0; r < n; ++r) {
    const auto [b5, e5] = rows_of(5, r);
    EXPECT_EQ(out[r].first.shape(), (Shape{e5 - b5}));
    EXPECT_EQ(out[r].first.to_vector(), std::vector<float>(static_cast<std::size_t>(e5 - b5), ids));
    const auto [b3, e3] = rows_of(3, r);
    EXPECT_EQ(out[r].second.shape(), (Shape{e3 - b3, 2, 2}));
    EXPECT_EQ(out[r].second.to_vector(), std::vector<float>(static_cast<std::size_t>((e3 - b3) * 4), float(n)));
  }
}

// all_gather(reduce_scatter(x), 0) is all_reduce(x), bit for bit, on values whose sums round.
TEST_P(ReduceScatterTest, GatheredSlicesEqualTheAllReduceBitForBit) {
  auto s = make();
  for (const ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN}) {
    auto out = s->run([&] {
      auto* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      std::vector<float> v(1000 * 3);
      uint32_t seed = 12345u + 7919u * static_cast<uint32_t>(r);
      for (auto& x : v) {
        seed = seed * 1664525u + 1013904223u;
        x = static_cast<float>(seed >> 8) / 16777216.0f * 3.0f - 1.1f;
      }
      const Tensor<float> x = Tensor<float>::from_vector(v, {1000, 3});
      const Tensor<float> gathered = ctx->all_gather(ctx->reduce_scatter(op, x), 0);
      const Tensor<float> reduced = ctx->all_reduce(op, x);
      return std::memcmp(gathered.data(), reduced.data(), reduced.numel() * sizeof(float)) == 0 &&
             gathered.shape() == reduced.shape();
    });
    for (int r = 0; r < n(); ++r) EXPECT_TRUE(out[r]) << "replica " << r << " op " << reduce_op_name(op);
  }
}

TEST_P(ReduceScatterTest, TheAsynchronousFormEqualsTheSynchronousOne) {
  auto s = make();
  auto out = s->run([&] {
    auto* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    Tensor<float> x = ramp<float>(11, 2, r) * 0.37f;
    auto first = ctx->reduce_scatter_async(ReduceOp::MEAN, x);
    auto second = ctx->all_reduce_async(ReduceOp::SUM, x);  // issued after: joined after
    const Tensor<float> sync = ctx->reduce_scatter(ReduceOp::MEAN, x);
    const Tensor<float> async = first.wait();
    return async.shape() == sync.shape() && async.to_vector() == sync.to_vector() &&
           second.wait().to_vector() == ctx->all_reduce(ReduceOp::SUM, x).to_vector();
  });
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(out[r]) << "replica " << r;
}

TEST_P(ReduceScatterTest, MismatchesAreRejectedBeforeAnyByteMoves) {
  if (n() < 2) GTEST_SKIP() << "needs two replicas to disagree";
  auto s = make();
  auto shapes = message_of<InvalidArgumentError>([&] {
    s->run([] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::zeros({r == 1 ? 5 : 4, 2}));
    });
  });
  EXPECT_THAT(shapes, HasSubstr("reduce_scatter: replica 0 passed shape (4, 2) but replica 1 passed shape (5, 2)"));
  auto ops = message_of<InvalidArgumentError>([&] {
    s->run([] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      get_replica_context()->reduce_scatter(r == 1 ? ReduceOp::MEAN : ReduceOp::SUM, Tensor<float>::zeros({4}));
    });
  });
  EXPECT_THAT(ops, HasSubstr("reduce_scatter: replica 0 passed reduce op SUM but replica 1 passed MEAN"));
  auto dtypes = message_of<InvalidArgumentError>([&] {
    s->run([] {
      if (get_replica_context()->replica_id_in_sync_group() == 1)
        get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<double>::zeros({4}));
      else
        get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::zeros({4}));
    });
  });
  EXPECT_THAT(dtypes, HasSubstr("reduce_scatter: replica 0 passed dtype float32 but replica 1 passed dtype float64"));
  auto compression = message_of<InvalidArgumentError>([&] {
    s->run([] {
      CommunicationOptions o;
      if (get_replica_context()->replica_id_in_sync_group() == 1) o.compression = Compression::FP16;
      get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::zeros({4}), o);
    });
  });
  EXPECT_THAT(compression,
              HasSubstr("reduce_scatter: replica 0 passed CommunicationOptions::compression NONE but replica 1 "
                        "passed FP16"));
  auto kinds = message_of<FailedPreconditionError>([&] {
    s->run([] {
      auto* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() == 1)
        ctx->all_reduce(ReduceOp::SUM, Tensor<float>::zeros({4}));
      else
        ctx->reduce_scatter(ReduceOp::SUM, Tensor<float>::zeros({4}));
    });
  });
  EXPECT_THAT(kinds, HasSubstr("reduce_scatter"));
  EXPECT_THAT(kinds, HasSubstr("all_reduce"));
  // The strategy is still usable.
  auto ok = s->run([] { return get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::full({8}, 1.0f)); });
  EXPECT_EQ(ok[0].to_vector()[0], float(n()));
}

TEST_P(ReduceScatterTest, BadValuesAreRejectedWhereTheyArePassed) {
  auto s = make();
  auto rank0 = message_of<InvalidArgumentError>(
      [&] { s->run([] { get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::scalar(1)); }); });
  EXPECT_THAT(rank0, HasSubstr("rank-0 value has no rows to scatter"));
  auto mean = message_of<InvalidArgumentError>(
      [&] { s->run([] { get_replica_context()->reduce_scatter(ReduceOp::MEAN, Tensor<int32_t>::full({4}, 1)); }); });
  EXPECT_THAT(mean, HasSubstr(": MEAN of integer values has no exact integer result"));
  auto async_rank0 = message_of<InvalidArgumentError>([&] {
    s->run([] { get_replica_context()->reduce_scatter_async(ReduceOp::SUM, Tensor<float>::scalar(1)).wait(); });
  });
  EXPECT_THAT(async_rank0, HasSubstr("rank-0 value has no rows to scatter"));
}

TEST_P(ReduceScatterTest, AnEmptyTensorGivesEmptySlices) {
  auto s = make();
  auto out = s->run([] { return get_replica_context()->reduce_scatter(ReduceOp::SUM, Tensor<float>::zeros({0, 3})); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r].shape(), (Shape{0, 3}));
}

INSTANTIATE_TEST_SUITE_P(Replicas, ReduceScatterTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(testing::Ops::InProcess, testing::Ops::ToOneDevice)),
                         testing::replicas_and_ops_name);

}  // namespace
}  // namespace mirrored
