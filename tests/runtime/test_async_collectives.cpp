// ReplicaContext::all_reduce_async and PendingCollective (docs/api.md §11) on CPU replicas: results equal
// the synchronous call bit for bit, issue order, waits in any order, errors and deadlines at
// wait(), the destructor waits, failures end the run and the next run works, scratch inputs are
// reduced in place.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;

using testing::eventually;

// Non-integer values whose sums round: only the same additions in the same order agree bit for bit.
Tensor<float> ramp(int replica, int64_t len) {
  std::vector<float> v(static_cast<std::size_t>(len));
  for (int64_t i = 0; i < len; ++i) v[static_cast<std::size_t>(i)] = 0.1f * float(replica + 1) + 0.37f * float(i % 97);
  return Tensor<float>::from_vector(std::move(v), {len});
}

template <class T>
std::vector<uint64_t> bits(const Tensor<T>& t) {
  std::vector<uint64_t> out;
  for (T x : t.to_vector()) {
    if constexpr (sizeof(T) == 4)
      out.push_back(std::bit_cast<uint32_t>(x));
    else
      out.push_back(std::bit_cast<uint64_t>(x));
  }
  return out;
}

class AsyncAllReduce : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  // n(n+1)/2: the sum over replicas of r + 1.
  float tri() const { return float(n() * (n() + 1) / 2); }
};

TEST_P(AsyncAllReduce, WaitEqualsTheSynchronousCallBitwise) {
  MirroredStrategy s(cpus(n()));
  using Nest = std::tuple<std::vector<Tensor<float>>, double, Tensor<double>>;
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN}) {
    auto out = s.run([op] {
      ReplicaContext* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      const Nest v{
          {ramp(r, 1000), ramp(r, 37), ramp(r, 5000)}, 0.1 * (r + 1), Tensor<double>::full({5}, 0.3 * (r + 1))};
      Nest sync = ctx->all_reduce(op, v);
      Nest async = ctx->all_reduce_async(op, v).wait();
      // A temporary is scratch and is reduced in place: still the same bits.
      Tensor<float> in_place = ctx->all_reduce_async(op, ramp(r, 5000)).wait();
      return std::make_tuple(sync, async, in_place);
    });
    for (int r = 0; r < n(); ++r) {
      const auto& [sync, async, in_place] = out[r];
      for (std::size_t i = 0; i < 3; ++i)
        EXPECT_EQ(bits(std::get<0>(async)[i]), bits(std::get<0>(sync)[i])) << "replica " << r << " tensor " << i;
      EXPECT_EQ(std::bit_cast<uint64_t>(std::get<1>(async)), std::bit_cast<uint64_t>(std::get<1>(sync)));
      EXPECT_EQ(bits(std::get<2>(async)), bits(std::get<2>(sync)));
      EXPECT_EQ(bits(in_place), bits(std::get<0>(sync)[2])) << "replica " << r;
    }
  }
}

TEST_P(AsyncAllReduce, IssuedInOrderAndWaitedInAnyOrder) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    std::vector<PendingCollective<Tensor<float>>> pending;
    for (int k = 1; k <= 6; ++k)
      pending.push_back(ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({k * 1000}, float(k * (r + 1)))));
    std::vector<std::vector<float>> got(6);
    for (int k : {5, 0, 3, 1, 4, 2})
      got[static_cast<std::size_t>(k)] = pending[static_cast<std::size_t>(k)].wait().to_vector();
    return got;
  });
  for (int r = 0; r < n(); ++r) {
    for (int k = 1; k <= 6; ++k)
      EXPECT_EQ(out[r][static_cast<std::size_t>(k - 1)], std::vector<float>(k * 1000, float(k) * tri()))
          << "replica " << r << " collective " << k;
  }
}

TEST_P(AsyncAllReduce, TheReplicaGoesOnWhileItsCollectiveRuns) {
  // Replica 0 issues, then lets the others issue theirs. A call that blocked until every replica
  // has joined would never return here (the others wait for replica 0 to go on).
  MirroredStrategy s(cpus(n()));
  std::atomic<bool> issued{false};
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    if (r == 0) {
      auto p = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({64}, 1.0f));
      issued.store(true);
      return p.wait().to_vector();
    }
    if (!eventually([&] { return issued.load(); }))
      throw std::runtime_error("replica 0 never returned from all_reduce_async");
    return ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({64}, 1.0f)).wait().to_vector();
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], std::vector<float>(64, float(n())));
}

TEST_P(AsyncAllReduce, SynchronousCollectivesKeepTheIssueOrder) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    auto first = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({10}, float(r + 1)));
    auto second = ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({3}, 2.0f * float(r + 1)));
    auto gathered = ctx->all_gather(Tensor<float>::full({1}, float(r)), 0);
    auto third = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({4}, 3.0f * float(r + 1)));
    ctx->merge_call([](Strategy&) {});
    return std::make_tuple(first.wait().to_vector(), second.to_vector(), gathered.to_vector(),
                           third.wait().to_vector());
  });
  std::vector<float> ids;
  for (int r = 0; r < n(); ++r) ids.push_back(float(r));
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::get<0>(out[r]), std::vector<float>(10, tri()));
    EXPECT_EQ(std::get<1>(out[r]), std::vector<float>(3, 2.0f * tri()));
    EXPECT_EQ(std::get<2>(out[r]), ids);
    EXPECT_EQ(std::get<3>(out[r]), std::vector<float>(4, 3.0f * tri()));
  }
}

// Calls the in-process all-reduce after a pause, then notes that this replica's part is done:
// whoever observes `done` afterwards knows the collective had finished on that replica.
class SlowAllReduce final : public InProcessAllReduce {
 public:
  explicit SlowAllReduce(int n) : done(static_cast<std::size_t>(n)) {}
  std::string name() const override { return "SlowAllReduce"; }
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    InProcessAllReduce::all_reduce(op, step);
    done[static_cast<std::size_t>(step.replica())].store(true);
  }
  std::vector<std::atomic<bool>> done;
};

TEST_P(AsyncAllReduce, TheDestructorWaits) {
  auto ops = std::make_shared<SlowAllReduce>(n());
  MirroredStrategy s(cpus(n()), ops);
  auto seen = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    { auto dropped = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({8}, 1.0f)); }
    return ops->done[static_cast<std::size_t>(r)].load();
  });
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(seen[r]) << "replica " << r << " left its collective in flight";
}

TEST_P(AsyncAllReduce, NothingIssuedOutlivesTheRun) {
  auto ops = std::make_shared<SlowAllReduce>(n());
  MirroredStrategy s(cpus(n()), ops);
  std::vector<std::optional<PendingCollective<Tensor<float>>>> kept(static_cast<std::size_t>(n()));
  s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    kept[static_cast<std::size_t>(r)] = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({8}, float(r + 1)));
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_TRUE(ops->done[static_cast<std::size_t>(r)].load()) << "replica " << r;
    EXPECT_TRUE(kept[static_cast<std::size_t>(r)]->ready()) << "replica " << r;
    EXPECT_EQ(kept[static_cast<std::size_t>(r)]->wait().to_vector(), std::vector<float>(8, tri()));
  }
}

TEST_P(AsyncAllReduce, ScratchInputsAreReducedInPlaceAndSharedOnesNever) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    Tensor<float> scratch = Tensor<float>::full({3000}, float(r + 1));
    const float* scratch_data = scratch.data();
    Tensor<float> moved = ctx->all_reduce_async(ReduceOp::SUM, std::move(scratch)).wait();
    const Tensor<float> kept = Tensor<float>::full({3000}, float(r + 1));
    Tensor<float> copied = ctx->all_reduce_async(ReduceOp::SUM, kept).wait();
    return std::make_tuple(moved.data() == scratch_data, moved.to_vector(), copied.data() != kept.data(),
                           copied.to_vector(), kept.to_vector());
  });
  for (int r = 0; r < n(); ++r) {
    const auto& [reused, moved, fresh, copied, kept] = out[r];
    EXPECT_TRUE(reused) << "replica " << r << ": a moved-in tensor was not reduced in place";
    EXPECT_EQ(moved, std::vector<float>(3000, tri()));
    EXPECT_TRUE(fresh) << "replica " << r << ": a tensor the caller still holds was overwritten";
    EXPECT_EQ(copied, std::vector<float>(3000, tri()));
    EXPECT_EQ(kept, std::vector<float>(3000, float(r + 1)));
  }
}

TEST(AsyncAllReduceInPlace, LargePacksStreamTheirResultsBackIntoTheInputs) {
  // 8 MiB and more per pack: InProcessAllReduce writes through a scratch block around the cache.
  MirroredStrategy s(cpus(2));
  const int64_t len = (int64_t{8} << 20) / 4 + 1000;
  auto out = s.run([len] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    Tensor<float> x = ramp(r, len);
    const float* p = x.data();
    Tensor<float> sync = ctx->all_reduce(ReduceOp::SUM, ramp(r, len));
    Tensor<float> y = ctx->all_reduce_async(ReduceOp::SUM, std::move(x)).wait();
    return std::make_tuple(y.data() == p, bits(y) == bits(sync));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::get<0>(out[r])) << "replica " << r;
    EXPECT_TRUE(std::get<1>(out[r])) << "replica " << r;
  }
}

TEST(AsyncAllReduceErrors, WaitTwiceOrAfterAMoveIsAnError) {
  MirroredStrategy s(cpus(2));
  auto msgs = s.run([] {
    auto p = get_replica_context()->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f});
    p.wait();
    const std::string twice = testing::message_of<FailedPreconditionError>([&] { p.wait(); });
    auto q = get_replica_context()->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f});
    auto moved = std::move(q);
    const std::string after_move = testing::message_of<FailedPreconditionError>([&] { q.wait(); });
    return std::make_tuple(twice, after_move, moved.wait().to_vector());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(std::get<0>(msgs[r]), HasSubstr("nothing to wait for"));
    EXPECT_THAT(std::get<1>(msgs[r]), HasSubstr("nothing to wait for"));
    EXPECT_EQ(std::get<2>(msgs[r]), std::vector<float>{2.0f});
  }
}

TEST(AsyncAllReduceErrors, BadArgumentsAreRejectedAtIssue) {
  MirroredStrategy s(cpus(2));
  auto msgs = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    CommunicationOptions bad;
    bad.timeout_seconds = 0.0;
    return std::make_tuple(
        testing::message_of<InvalidArgumentError>([&] { ctx->all_reduce_async(ReduceOp::MEAN, Tensor<int32_t>{1}); }),
        testing::message_of<InvalidArgumentError>(
            [&] { ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}, bad); }));
  });
  EXPECT_THAT(std::get<0>(msgs[1]), HasSubstr("all_reduce_async on replica 1: MEAN of integer values"));
  EXPECT_THAT(std::get<1>(msgs[0]), HasSubstr("timeout_seconds must be positive"));
}

TEST(AsyncAllReduceErrors, OutsideItsRunIsAnError) {
  MirroredStrategy s(cpus(2));
  auto ctxs = s.run([] { return get_replica_context(); });
  EXPECT_THAT(testing::message_of<FailedPreconditionError>(
                  [&] { ctxs[0]->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}); }),
              HasSubstr("ReplicaContext::all_reduce_async"));
}

class AsyncAllReduceFailures : public AsyncAllReduce {};

TEST_P(AsyncAllReduceFailures, AMismatchSurfacesAtWaitOnEveryReplica) {
  MirroredStrategy s(cpus(n()));
  std::vector<std::optional<testing::Seen>> seen(static_cast<std::size_t>(n()));
  std::atomic<int> issue_errors{0};
  EXPECT_THROW(s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    std::optional<PendingCollective<Tensor<float>>> p;
    try {
      p = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({r == n() - 1 ? 3 : 2}, 1.0f));
    } catch (...) {
      issue_errors.fetch_add(1);
      throw;
    }
    testing::recording(seen[static_cast<std::size_t>(r)], [&] { return p->wait(); });
  }),
               InvalidArgumentError);
  EXPECT_EQ(issue_errors.load(), 0);
  for (int r = 0; r < n(); ++r) {
    ASSERT_TRUE(seen[static_cast<std::size_t>(r)]) << "replica " << r;
    EXPECT_EQ(seen[static_cast<std::size_t>(r)]->type, "InvalidArgumentError") << "replica " << r;
    EXPECT_THAT(seen[static_cast<std::size_t>(r)]->what,
                HasSubstr("replica 0 passed shape (2,) but replica " + std::to_string(n() - 1) + " passed shape (3,)"));
  }
  // The next run works.
  auto out = s.run([] { return get_replica_context()->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}).wait(); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r].to_vector(), std::vector<float>{float(n())});
}

TEST_P(AsyncAllReduceFailures, ADifferentCallSequenceIsReported) {
  MirroredStrategy s(cpus(n()));
  const std::string msg = testing::message_of<FailedPreconditionError>([&] {
    s.run([] {
      ReplicaContext* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() == 0)
        ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}).wait();
      else
        ctx->all_reduce(ReduceOp::SUM, Tensor<float>{1.0f});
    });
  });
  EXPECT_THAT(msg, HasSubstr("replica 0 called all_reduce_async (collective call 1)"));
  EXPECT_THAT(msg, HasSubstr("replica 1 called all_reduce (collective call 1)"));
}

TEST_P(AsyncAllReduceFailures, TheDeadlineCountsFromIssueAndSurfacesAtWait) {
  // Replica 0 gives its collective 0.2 s and does not wait for it; the last replica never joins
  // until replica 0's collective has ended. Only the watchdog can end it.
  MirroredStrategy s(cpus(n()));
  const int last = n() - 1;
  std::atomic<bool> expired{false};
  std::vector<std::optional<testing::Seen>> seen(static_cast<std::size_t>(n()));
  std::atomic<bool> ready_without_wait{false};
  const std::string msg = testing::message_of<DeadlineExceededError>([&] {
    s.run([&] {
      ReplicaContext* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      CommunicationOptions o;
      o.timeout_seconds = r == 0 ? 0.2 : 60.0;
      if (r == last) {
        eventually([&] { return expired.load(); });
        testing::recording(seen[static_cast<std::size_t>(r)],
                           [&] { return ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}, o).wait(); });
        return;
      }
      auto p = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}, o);
      if (r == 0) {
        ready_without_wait.store(eventually([&] { return p.ready(); }));
        expired.store(true);
      }
      testing::recording(seen[static_cast<std::size_t>(r)], [&] { return p.wait(); });
    });
  });
  EXPECT_TRUE(ready_without_wait.load()) << "nobody ended the collective while nobody waited for it";
  EXPECT_THAT(msg, HasSubstr("all_reduce_async on replica 0: not complete 0.2 s after it was issued"));
  EXPECT_THAT(msg, HasSubstr("replicas [" + std::to_string(last) + "] never arrived"));
  ASSERT_TRUE(seen[0]);
  EXPECT_EQ(seen[0]->type, "DeadlineExceededError");
  for (int r = 1; r < n(); ++r) {
    ASSERT_TRUE(seen[static_cast<std::size_t>(r)]) << "replica " << r;
    EXPECT_EQ(seen[static_cast<std::size_t>(r)]->type, "AbortedError") << "replica " << r;
  }
  auto out = s.run([] { return get_replica_context()->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f}).wait(); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r].to_vector(), std::vector<float>{float(n())});
}

TEST_P(AsyncAllReduceFailures, AReplicaThatThrowsEndsTheRunAndTheNextRunWorks) {
  auto ops = std::make_shared<SlowAllReduce>(n());
  MirroredStrategy s(cpus(n()), ops);
  // Replica 0 fails before issuing: the others' collectives are aborted.
  std::vector<std::optional<testing::Seen>> seen(static_cast<std::size_t>(n()));
  EXPECT_THROW(s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    if (r == 0) throw std::runtime_error("boom");
    auto p = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f});
    testing::recording(seen[static_cast<std::size_t>(r)], [&] { return p.wait(); });
  }),
               std::runtime_error);
  for (int r = 1; r < n(); ++r) {
    ASSERT_TRUE(seen[static_cast<std::size_t>(r)]) << "replica " << r;
    EXPECT_EQ(seen[static_cast<std::size_t>(r)]->type, "AbortedError") << "replica " << r;
    EXPECT_THAT(seen[static_cast<std::size_t>(r)]->what, HasSubstr("boom"));
  }
  // Replica 0 fails with its collective in flight: the destructor lets it finish with the others.
  std::vector<std::vector<float>> got(static_cast<std::size_t>(n()));
  EXPECT_THROW(s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    auto p = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f});
    if (r == 0) throw std::runtime_error("boom in flight");
    got[static_cast<std::size_t>(r)] = p.wait().to_vector();
  }),
               std::runtime_error);
  for (int r = 1; r < n(); ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], std::vector<float>{float(n())});
  auto out = s.run([] { return get_replica_context()->all_reduce_async(ReduceOp::SUM, Tensor<float>{2.0f}).wait(); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r].to_vector(), std::vector<float>{2.0f * float(n())});
}

TEST_P(AsyncAllReduceFailures, AnErrorNobodyWaitedForFailsTheRun) {
  MirroredStrategy s(cpus(n()));
  EXPECT_THROW(s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    auto dropped = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({r == 0 ? 1 : 2}, 1.0f));
  }),
               InvalidArgumentError);
}

TEST_P(AsyncAllReduceFailures, ACollectiveKeptPastTheFunctionThatFailsFailsTheRun) {
  // Replica 0 keeps its collective beyond its function; the others never issue one, so it fails
  // after replica 0 stopped looking at it. The run reports it, as it would a synchronous one.
  MirroredStrategy s(cpus(n()));
  std::optional<PendingCollective<Tensor<float>>> kept;
  const std::string msg = testing::message_of<FailedPreconditionError>([&] {
    s.run([&] {
      ReplicaContext* ctx = get_replica_context();
      if (ctx->replica_id_in_sync_group() == 0) kept = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>{1.0f});
    });
  });
  EXPECT_THAT(msg, HasSubstr("returned from the replica function after 0 collective calls"));
  ASSERT_TRUE(kept);
  EXPECT_THROW(kept->wait(), FailedPreconditionError);
}

INSTANTIATE_TEST_SUITE_P(Replicas, AsyncAllReduce, ::testing::Values(1, 2, 4, 8));
INSTANTIATE_TEST_SUITE_P(Replicas, AsyncAllReduceFailures, ::testing::Values(2, 4, 8));

}  // namespace
}  // namespace mirrored
