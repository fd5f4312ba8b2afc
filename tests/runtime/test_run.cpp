// Strategy::run: threads, argument unwrapping, results, context rules and failure propagation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

class RunTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

TEST_P(RunTest, ReturnsOneResultPerReplicaInOrder) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] { return get_replica_context()->replica_id_in_sync_group() * 10; });
  ASSERT_EQ(out.size(), static_cast<std::size_t>(n()));
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], r * 10);
}

TEST_P(RunTest, UnwrapsDistributedArgumentsAndPassesOthersAsIs) {
  MirroredStrategy s(cpus(n()));
  auto ids =
      s.experimental_distribute_values_from_function([](const ValueContext& c) { return c.replica_id_in_sync_group; });
  std::vector<Tensor<float>> same(n(), Tensor<float>{7, 8});
  Mirrored<Tensor<float>> mirrored(same);
  const std::string shared = "shared";
  auto out = s.run(
      [](int id, const Tensor<float>& m, const std::string& plain) {
        return std::make_tuple(id, m.to_vector()[1], reinterpret_cast<std::uintptr_t>(&plain));
      },
      ids, mirrored, shared);
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::get<0>(out[r]), r);
    EXPECT_EQ(std::get<1>(out[r]), 8.0f);
    EXPECT_EQ(std::get<2>(out[r]), reinterpret_cast<std::uintptr_t>(&shared));  // not copied
  }
}

TEST_P(RunTest, VoidFunctionRunsOncePerReplica) {
  MirroredStrategy s(cpus(n()));
  std::vector<int> calls(n(), 0);
  s.run([&] { ++calls[get_replica_context()->replica_id_in_sync_group()]; });
  EXPECT_EQ(calls, std::vector<int>(n(), 1));
}

TEST_P(RunTest, UsesOneLongLivedThreadPerReplica) {
  MirroredStrategy s(cpus(n()));
  auto first = s.run([] { return std::this_thread::get_id(); });
  for (int i = 0; i < 20; ++i) {
    auto again = s.run([] { return std::this_thread::get_id(); });
    EXPECT_EQ(again.values(), first.values());
  }
  std::set<std::thread::id> distinct(first.values().begin(), first.values().end());
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(n()));
  EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);
}

TEST_P(RunTest, ReplicaContextDescribesTheReplica) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    return std::make_tuple(ctx != nullptr, ctx->num_replicas_in_sync(), &ctx->strategy() == &s, &get_strategy() == &s,
                           has_strategy(), in_cross_replica_context());
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], std::make_tuple(true, n(), true, true, true, false));
}

TEST_P(RunTest, DistributedArgumentWithWrongComponentCountIsRejected) {
  MirroredStrategy s(cpus(n()));
  PerReplica<int> wrong(std::vector<int>(n() + 1, 1));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { s.run([](int) {}, wrong); }),
              HasSubstr(std::to_string(n() + 1) + " components"));
}

TEST_P(RunTest, ExceptionIsRethrownWithItsTypeAndOthersAreAborted) {
  MirroredStrategy s(cpus(n()));
  const int failing = n() - 1;
  std::vector<std::optional<testing::Seen>> seen(n());
  try {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      if (r == failing) throw std::out_of_range("replica went out of range");
      testing::recording(seen[r], [&] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1); });
    });
    FAIL() << "run did not throw";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "replica went out of range");
  }
  for (int r = 0; r < n(); ++r) {
    if (r == failing) continue;
    ASSERT_TRUE(seen[r].has_value()) << "replica " << r;
    EXPECT_EQ(seen[r]->type, "AbortedError");
    EXPECT_THAT(seen[r]->what, HasSubstr("replica " + std::to_string(failing) + " failed"));
  }
  // The strategy stays usable.
  auto sums = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 2); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(sums[r], 2 * n());
}

struct NotAStdException {
  int code;
};

TEST_P(RunTest, NonStandardExceptionTypeIsPreserved) {
  MirroredStrategy s(cpus(n()));
  try {
    s.run([] {
      if (get_replica_context()->replica_id_in_sync_group() == 0) throw NotAStdException{42};
    });
    FAIL() << "run did not throw";
  } catch (const NotAStdException& e) {
    EXPECT_EQ(e.code, 42);
  }
}

TEST_P(RunTest, ReplicaContextUsedAfterItsRunIsRejected) {
  MirroredStrategy s(cpus(n()));
  auto ctxs = s.run([] { return get_replica_context(); });
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { ctxs[0]->all_reduce(ReduceOp::SUM, 1.0f); }),
              HasSubstr("outside the Strategy::run it belongs to"));
  EXPECT_THROW(ctxs[0]->merge_call([](Strategy&) {}), FailedPreconditionError);
  EXPECT_THROW(ctxs[0]->all_gather(Tensor<float>{1}, 0), FailedPreconditionError);
}

TEST_P(RunTest, CrossReplicaMethodsAreRejectedInsideRun) {
  MirroredStrategy s(cpus(n()));
  auto msgs = s.run([&] {
    const auto per = PerReplica<int>(std::vector<int>(s.num_replicas_in_sync(), 1));
    const auto tensors =
        PerReplica<Tensor<float>>(std::vector<Tensor<float>>(s.num_replicas_in_sync(), Tensor<float>{1}));
    return std::vector<std::string>{
        message_of<FailedPreconditionError>([&] { s.run([] {}); }),
        message_of<FailedPreconditionError>([&] { (void)s.reduce(ReduceOp::SUM, per, std::nullopt); }),
        message_of<FailedPreconditionError>([&] { auto sc = s.scope(); }),
        message_of<FailedPreconditionError>([&] { (void)s.gather(tensors, 0); }),
    };
  });
  for (int r = 0; r < n(); ++r) {
    for (int i = 0; i < 3; ++i)
      EXPECT_THAT(msgs[r][i],
                  HasSubstr("Method requires being in cross-replica context, use get_replica_context().merge_call()"));
    EXPECT_THAT(msgs[r][3],
                HasSubstr("requires cross-replica context, use get_replica_context().all_gather() instead"));
  }
}

TEST_P(RunTest, RunsFromSeveralHostThreadsAreSerialised) {
  MirroredStrategy s(cpus(n()));
  std::atomic<int> wrong{0};
  testing::run_ranks(2, [&](int t) {
    for (int i = 0; i < 50; ++i) {
      auto out = s.run([&] { return get_replica_context()->all_reduce(ReduceOp::SUM, t + i); });
      for (int r = 0; r < n(); ++r) wrong += out[r] != (t + i) * n();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Replicas, RunTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored
