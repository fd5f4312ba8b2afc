// GradientBuckets (docs/api.md §11): buckets of bytes_per_pack filled in push order, each all-reduced
// (asynchronously) once full, results in push order, the partial last bucket, several dtypes,
// bitwise equality with all_reduce, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;

using testing::eventually;

// The in-process all-reduce, recording how many tensors each collective of replica 0 reduced.
class RecordingAllReduce final : public InProcessAllReduce {
 public:
  std::string name() const override { return "RecordingAllReduce"; }
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    if (step.replica() == 0) {
      std::lock_guard lock(mu);
      tensors_per_call.push_back(step.inputs(0).size());
      compressions.push_back(step.compression());
    }
    InProcessAllReduce::all_reduce(op, step);
    if (step.replica() == 0) calls.fetch_add(1);
  }
  std::vector<std::size_t> sizes() {
    std::lock_guard lock(mu);
    return tensors_per_call;
  }
  std::vector<Compression> compressions_seen() {
    std::lock_guard lock(mu);
    return compressions;
  }
  std::mutex mu;
  std::vector<std::size_t> tensors_per_call;
  std::vector<Compression> compressions;
  std::atomic<int> calls{0};
};

class Buckets : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  float tri() const { return float(n() * (n() + 1) / 2); }
};

TEST_P(Buckets, FillInPushOrderStartWhenFullAndReturnInPushOrder) {
  auto ops = std::make_shared<RecordingAllReduce>();
  MirroredStrategy s(cpus(n()), ops);
  // Gradient k has sizes[k] floats, every element k * (r + 1). Buckets of 16 bytes (4 floats):
  // {1, 5} (24 bytes once 5 is in), {1, 1, 2} (exactly 16), {3} (partial, started by finish).
  const std::vector<int64_t> sizes{1, 5, 1, 1, 2, 3};
  std::atomic<bool> started_before_finish{true};
  auto out = s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    GradientBuckets<float> buckets(ReduceOp::SUM, 16);
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      buckets.push(Tensor<float>::full({sizes[k]}, float((k + 1) * static_cast<std::size_t>(r + 1))));
      // The first bucket is full after gradient 1: its all-reduce starts while the others are
      // still being produced.
      if (k == 1 && r == 0 && !eventually([&] { return ops->calls.load() >= 1; })) started_before_finish.store(false);
    }
    std::vector<std::vector<float>> got;
    for (const auto& g : buckets.finish()) got.push_back(g.to_vector());
    return got;
  });
  EXPECT_TRUE(started_before_finish.load());
  EXPECT_EQ(ops->sizes(), (std::vector<std::size_t>{2, 3, 1}));
  for (int r = 0; r < n(); ++r) {
    ASSERT_EQ(out[r].size(), sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_EQ(out[r][k], std::vector<float>(static_cast<std::size_t>(sizes[k]), float(k + 1) * tri()))
          << "replica " << r << " gradient " << k;
    }
  }
}

// CommunicationOptions: bytes_per_pack sizes the buckets, the compression reaches every bucket's
// collective (which, with no other worker, sums in full precision).
TEST_P(Buckets, TakeCommunicationOptions) {
  auto ops = std::make_shared<RecordingAllReduce>();
  MirroredStrategy s(cpus(n()), ops);
  const std::vector<int64_t> sizes{1, 5, 1, 1, 2, 3};  // buckets of 16 bytes: {1, 5}, {1, 1, 2}, {3}
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    CommunicationOptions options;
    options.bytes_per_pack = 16;
    options.compression = Compression::BF16;
    options.timeout_seconds = 60;
    GradientBuckets<float> buckets(ReduceOp::SUM, options);
    std::vector<Tensor<float>> grads;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      grads.push_back(Tensor<float>::full({sizes[k]}, 0.1f * float(r + 1) + 0.01f * float(k)));
    for (const auto& g : grads) buckets.push(g);
    bool same = true;
    const auto reduced = buckets.finish();
    for (std::size_t k = 0; k < grads.size(); ++k)
      same &= reduced[k].to_vector() == ctx->all_reduce(ReduceOp::SUM, grads[k]).to_vector();
    return same;
  });
  EXPECT_EQ(ops->sizes(), (std::vector<std::size_t>{2, 3, 1, 1, 1, 1, 1, 1, 1}));
  const auto seen = ops->compressions_seen();
  ASSERT_EQ(seen.size(), 9u);
  for (std::size_t call = 0; call < 3; ++call) EXPECT_EQ(seen[call], Compression::BF16) << "bucket " << call;
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(out[r]) << "replica " << r;
}

TEST_P(Buckets, EqualTheSynchronousAllReduceBitwise) {
  MirroredStrategy s(cpus(n()));
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN}) {
    auto out = s.run([op] {
      ReplicaContext* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      GradientBuckets<double> buckets(op, 3000);
      std::vector<Tensor<double>> grads;
      for (int k = 0; k < 7; ++k) {
        std::vector<double> v(static_cast<std::size_t>(100 * (k + 1)));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * (r + 1) + 0.013 * double(i) + 0.7 * k;
        grads.push_back(Tensor<double>::from_vector(v, {static_cast<int64_t>(v.size())}));
      }
      for (const auto& g : grads) buckets.push(g);
      std::vector<Tensor<double>> reduced = buckets.finish();
      bool same = reduced.size() == grads.size();
      for (std::size_t k = 0; same && k < grads.size(); ++k) {
        const auto a = reduced[k].to_vector();
        const auto b = ctx->all_reduce(op, grads[k]).to_vector();
        for (std::size_t i = 0; i < a.size(); ++i)
          same &= std::bit_cast<uint64_t>(a[i]) == std::bit_cast<uint64_t>(b[i]);
      }
      return same;
    });
    for (int r = 0; r < n(); ++r) EXPECT_TRUE(out[r]) << "replica " << r;
  }
}

TEST_P(Buckets, OneBucketPerTypeInterleaved) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    GradientBuckets<float> floats(ReduceOp::SUM, 8);
    GradientBuckets<int64_t> ints(ReduceOp::SUM, 16);
    for (int k = 1; k <= 5; ++k) {
      floats.push(Tensor<float>::full({k}, float(k * (r + 1))));
      ints.push(Tensor<int64_t>::full({k + 1}, int64_t{1} << (k + r)));
    }
    std::vector<std::vector<float>> f;
    for (const auto& g : floats.finish()) f.push_back(g.to_vector());
    std::vector<std::vector<int64_t>> i;
    for (const auto& g : ints.finish()) i.push_back(g.to_vector());
    return std::make_pair(f, i);
  });
  for (int r = 0; r < n(); ++r) {
    ASSERT_EQ(out[r].first.size(), 5u);
    ASSERT_EQ(out[r].second.size(), 5u);
    for (int k = 1; k <= 5; ++k) {
      EXPECT_EQ(out[r].first[static_cast<std::size_t>(k - 1)], std::vector<float>(k, float(k) * tri()));
      int64_t sum = 0;
      for (int q = 0; q < n(); ++q) sum += int64_t{1} << (k + q);
      EXPECT_EQ(out[r].second[static_cast<std::size_t>(k - 1)], std::vector<int64_t>(k + 1, sum));
    }
  }
}

TEST_P(Buckets, NothingPushedIsNothingReducedAndTheObjectIsReusable) {
  auto ops = std::make_shared<RecordingAllReduce>();
  MirroredStrategy s(cpus(n()), ops);
  auto out = s.run([] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    GradientBuckets<float> buckets;  // 25 MiB: everything in one bucket, started by finish
    const std::size_t empty = buckets.finish().size();
    std::vector<float> step;
    for (int round = 1; round <= 2; ++round) {
      buckets.push(Tensor<float>::full({4}, float(round * (r + 1))));
      buckets.push(Tensor<float>::full({2}, float(round * (r + 1))));
      for (const auto& g : buckets.finish())
        for (float x : g.to_vector()) step.push_back(x);
    }
    return std::make_pair(empty, step);
  });
  EXPECT_EQ(ops->sizes(), (std::vector<std::size_t>{2, 2}));
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].first, 0u);
    std::vector<float> want(6, tri());
    want.insert(want.end(), 6, 2.0f * tri());
    EXPECT_EQ(out[r].second, want);
  }
}

TEST_P(Buckets, MovedInGradientsAreReducedInPlace) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    GradientBuckets<float> buckets(ReduceOp::SUM, 1024);
    std::vector<const float*> where;
    for (int k = 0; k < 4; ++k) {
      Tensor<float> g = Tensor<float>::full({300}, float(r + 1));
      where.push_back(g.data());
      buckets.push(std::move(g));
    }
    bool same = true;
    auto reduced = buckets.finish();
    for (std::size_t k = 0; k < reduced.size(); ++k) same &= reduced[k].data() == where[k];
    return same;
  });
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(out[r]) << "replica " << r;
}

TEST_P(Buckets, MismatchedGradientsFailFinishOnEveryReplica) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas";
  MirroredStrategy s(cpus(n()));
  std::vector<std::optional<testing::Seen>> seen(static_cast<std::size_t>(n()));
  EXPECT_THROW(s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    GradientBuckets<float> buckets(ReduceOp::SUM, 8);
    buckets.push(Tensor<float>::full({2}, 1.0f));
    buckets.push(Tensor<float>::full({r == 1 ? 3 : 2}, 1.0f));
    testing::recording(seen[static_cast<std::size_t>(r)], [&] { return buckets.finish(); });
  }),
               InvalidArgumentError);
  for (int r = 0; r < n(); ++r) {
    ASSERT_TRUE(seen[static_cast<std::size_t>(r)]) << "replica " << r;
    EXPECT_THAT(seen[static_cast<std::size_t>(r)]->what,
                HasSubstr("replica 0 passed shape (2,) but replica 1 passed shape (3,)"));
  }
}

TEST(BucketsErrors, BadArgumentsAndContexts) {
  MirroredStrategy s(cpus(2));
  {
    auto scope = s.scope();
    EXPECT_THAT(testing::message_of<FailedPreconditionError>([] { GradientBuckets<float> b; }),
                HasSubstr("inside Strategy::run"));
  }
  auto msgs = s.run([] {
    return std::make_pair(
        testing::message_of<InvalidArgumentError>([] { GradientBuckets<int32_t> b(ReduceOp::MEAN); }),
        testing::message_of<InvalidArgumentError>([] { GradientBuckets<float> b(ReduceOp::SUM, -1); }));
  });
  EXPECT_THAT(msgs[1].first, HasSubstr("GradientBuckets on replica 1: MEAN of integer values"));
  EXPECT_THAT(msgs[0].second, HasSubstr("bytes_per_pack must be >= 0, got -1"));
  auto negative = s.run([] {
    return testing::message_of<InvalidArgumentError>(
        [] { GradientBuckets<float> b(ReduceOp::SUM, CommunicationOptions{.bytes_per_pack = -2}); });
  });
  EXPECT_THAT(negative[0], HasSubstr("bytes_per_pack must be >= 0, got -2"));
}

INSTANTIATE_TEST_SUITE_P(Replicas, Buckets, ::testing::Values(1, 2, 4, 8));

}  // namespace
}  // namespace mirrored
