// Failure behaviour: mismatched collective sequences, deadlines, stall warnings, aborts and
// faults injected into the cross-device ops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using namespace std::chrono_literals;

class FailureTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

TEST_P(FailureTest, ReplicaMakingFewerCollectivesFailsFast) {
  MirroredStrategy s(cpus(n()));
  s.extended().set_collective_timeout_seconds(600);  // must not be what ends the wait
  const auto start = std::chrono::steady_clock::now();
  std::string msg = message_of<FailedPreconditionError>([&] {
    s.run([] {
      get_replica_context()->all_reduce(ReduceOp::SUM, 1);
      if (id() == 0) get_replica_context()->all_reduce(ReduceOp::SUM, 2);
    });
  });
  EXPECT_THAT(msg, HasSubstr("Some replicas made a different number of"));
  // Whichever of replicas 1.. returned first is named (they race to return).
  EXPECT_THAT(msg,
              ::testing::ContainsRegex("replica [1-9] returned from the replica function after 1 collective calls"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

TEST_P(FailureTest, DifferentKindsOfCollectiveAreAMismatch) {
  MirroredStrategy s(cpus(n()));
  const int last = n() - 1;
  std::string msg = message_of<FailedPreconditionError>([&] {
    s.run([&] {
      if (id() == last)
        get_replica_context()->merge_call([](Strategy&) {});
      else
        get_replica_context()->all_reduce(ReduceOp::SUM, 1);
    });
  });
  EXPECT_THAT(msg, HasSubstr("Some replicas made a different number of collective or merge_call calls"));
  EXPECT_THAT(msg, HasSubstr("replica " + std::to_string(n() - 1) + " called merge_call"));
  EXPECT_THAT(msg, HasSubstr("replica 0 called all_reduce"));
}

TEST_P(FailureTest, MissingReplicaGivesDeadlineExceededNamingIt) {
  MirroredStrategy s(cpus(n()));
  const int late = n() - 1;
  std::vector<std::optional<testing::Seen>> seen(n());
  std::string msg = message_of<DeadlineExceededError>([&] {
    s.run([&] {
      if (id() == late) {
        std::this_thread::sleep_for(600ms);
        return;
      }
      CommunicationOptions o;
      o.timeout_seconds = 0.2;
      testing::recording(seen[id()], [&] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1, o); });
    });
  });
  EXPECT_THAT(msg, HasSubstr("for replicas [" + std::to_string(late) + "] that never arrived"));
  EXPECT_THAT(msg, HasSubstr("all_reduce (collective call 1)"));
  for (int r = 0; r < late; ++r) {
    ASSERT_TRUE(seen[r].has_value());
    EXPECT_THAT(seen[r]->type, ::testing::AnyOf("DeadlineExceededError", "AbortedError"));
  }
  auto ok = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1); });
  EXPECT_EQ(ok[0], n());
}

TEST_P(FailureTest, HugeAndInfiniteTimeoutsMeanWaitForever) {
  MirroredStrategy s(cpus(n()));
  for (double timeout : {1e12, std::numeric_limits<double>::infinity()}) {
    auto out = s.run([&] {
      if (id() == 0) std::this_thread::sleep_for(100ms);
      CommunicationOptions o;
      o.timeout_seconds = timeout;
      return get_replica_context()->all_reduce(ReduceOp::SUM, 1, o);
    });
    EXPECT_EQ(out[n() - 1], n()) << timeout;
  }
}

TEST_P(FailureTest, MergeCallUsesTheStrategyDeadline) {
  MirroredStrategy s(cpus(n()));
  s.extended().set_collective_timeout_seconds(0.2);
  std::string msg = message_of<DeadlineExceededError>([&] {
    s.run([] {
      if (id() == 0) {
        std::this_thread::sleep_for(600ms);
        return;
      }
      get_replica_context()->merge_call([](Strategy&) {});
    });
  });
  EXPECT_THAT(msg, HasSubstr("merge_call"));
  EXPECT_THAT(msg, HasSubstr("for replicas [0]"));
}

TEST_P(FailureTest, StallWarningIsLoggedBeforeTheDeadline) {
  ::setenv("MIRRORED_STALL_WARN_S", "0.05", 1);
  MirroredStrategy s(cpus(n()));
  ::unsetenv("MIRRORED_STALL_WARN_S");
  const int last = n() - 1;
  // The last replica comes 300 ms after every other has come, so that the warning of the one that
  // came last among them (50 ms after it came) names the last replica alone, however late a loaded
  // machine starts the others.
  std::atomic<int> came{0};
  ::testing::internal::CaptureStderr();
  s.run([&] {
    if (id() == last) {
      while (came.load() < last) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(300ms);
    } else {
      came.fetch_add(1);
    }
    get_replica_context()->all_reduce(ReduceOp::SUM, 1);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("[mirrored WARN]"));
  EXPECT_THAT(err, HasSubstr("for replicas [" + std::to_string(n() - 1) + "]"));
}

TEST_P(FailureTest, FailureReleasesReplicasBlockedInAllGather) {
  MirroredStrategy s(cpus(n()));
  std::vector<std::optional<testing::Seen>> seen(n());
  EXPECT_THROW(s.run([&] {
    if (id() == 0) {
      std::this_thread::sleep_for(50ms);
      throw InternalError("injected");
    }
    testing::recording(seen[id()], [] { return get_replica_context()->all_gather(Tensor<float>{1}, 0); });
  }),
               InternalError);
  for (int r = 1; r < n(); ++r) {
    ASSERT_TRUE(seen[r].has_value());
    EXPECT_EQ(seen[r]->type, "AbortedError");
    EXPECT_THAT(seen[r]->what, HasSubstr("replica 0 failed"));
  }
}

// A cross-device op that fails on one replica, like a broken link would.
class FaultyOps : public InProcessAllReduce {
 public:
  std::string name() const override { return "FaultyOps"; }
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    if (fail_on >= 0 && step.replica() == fail_on) throw UnavailableError("link to replica lost");
    InProcessAllReduce::all_reduce(op, step);
  }
  int fail_on = -1;
};

TEST_P(FailureTest, FaultInCrossDeviceOpsAbortsTheStepAndTheNextStepWorks) {
  auto ops = std::make_shared<FaultyOps>();
  MirroredStrategy s(cpus(n()), ops);
  ops->fail_on = n() - 1;
  std::vector<std::optional<testing::Seen>> seen(n());
  EXPECT_EQ(message_of<UnavailableError>([&] {
              s.run([&] {
                testing::recording(seen[id()], [] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
              });
            }),
            "link to replica lost");
  for (int r = 0; r < n() - 1; ++r) {
    ASSERT_TRUE(seen[r].has_value());
    EXPECT_EQ(seen[r]->type, "AbortedError");
  }
  ops->fail_on = -1;
  auto ok = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(ok[r], float(n()));
}

// A backend that implements nothing but its name.
class BareOps : public CrossDeviceOps {
 public:
  std::string name() const override { return "BareOps"; }
};

TEST_P(FailureTest, UnsupportedOperationsSaySoByName) {
  MirroredStrategy s(cpus(n()), std::make_shared<BareOps>());
  EXPECT_EQ(message_of<UnimplementedError>([&] { s.run([] { get_replica_context()->all_reduce(ReduceOp::SUM, 1); }); }),
            "BareOps does not support all_reduce");
  EXPECT_EQ(
      message_of<UnimplementedError>([&] { s.run([] { get_replica_context()->all_gather(Tensor<float>{1}, 0); }); }),
      "BareOps does not support all_gather");
  auto v = s.experimental_distribute_values_from_function([](const ValueContext&) { return 1; });
  EXPECT_EQ(message_of<UnimplementedError>([&] { (void)s.reduce(ReduceOp::SUM, v, std::nullopt); }),
            "BareOps does not support reduce");
}

INSTANTIATE_TEST_SUITE_P(Replicas, FailureTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored
