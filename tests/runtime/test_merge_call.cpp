// ReplicaContext::merge_call: runs once, in cross-replica context, results handed back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

class MergeCallTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

TEST_P(MergeCallTest, RunsOnceInCrossReplicaContextWithPerReplicaArguments) {
  MirroredStrategy s(cpus(n()));
  std::atomic<int> calls{0};
  std::vector<int> seen_args;
  bool cross = false, no_replica_ctx = false, right_strategy = false;
  auto out = s.run([&] {
    return get_replica_context()->merge_call(
        [&](Strategy& st, const PerReplica<int>& ids, const PerReplica<std::string>& names) {
          ++calls;
          seen_args = ids.values();
          cross = in_cross_replica_context();
          no_replica_ctx = get_replica_context() == nullptr;
          right_strategy = &st == &s && &get_strategy() == &s;
          return names[0] + "+" + std::to_string(ids.size());
        },
        id() * 3, std::string("r") + std::to_string(id()));
  });
  EXPECT_EQ(calls.load(), 1);
  std::vector<int> expected_args;
  for (int r = 0; r < n(); ++r) expected_args.push_back(3 * r);
  EXPECT_EQ(seen_args, expected_args);
  EXPECT_TRUE(cross);
  EXPECT_TRUE(no_replica_ctx);
  EXPECT_TRUE(right_strategy);
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], "r0+" + std::to_string(n()));
}

TEST_P(MergeCallTest, PerReplicaResultGivesEachReplicaItsComponent) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    return get_replica_context()->merge_call(
        [](Strategy&, const PerReplica<int>& v) {
          std::vector<int> doubled;
          for (int x : v.values()) doubled.push_back(2 * x);
          return PerReplica<int>(doubled);
        },
        id() + 1);
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], 2 * (r + 1));
}

TEST_P(MergeCallTest, MergeFnCanReduceAndReplicasContinueAfterwards) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([] {
    Tensor<float> total = get_replica_context()->merge_call(
        [](Strategy& st, const PerReplica<Tensor<float>>& v) { return st.reduce(ReduceOp::SUM, v, std::nullopt); },
        Tensor<float>{float(id()), 1});
    // Collectives keep working after a merge_call.
    const float again = get_replica_context()->all_reduce(ReduceOp::SUM, total.to_vector()[1]);
    return std::make_pair(total.to_vector(), again);
  });
  const float ids = float(n() * (n() - 1) / 2);
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].first, (std::vector<float>{ids, float(n())}));
    EXPECT_EQ(out[r].second, float(n() * n()));
  }
}

TEST_P(MergeCallTest, VoidMergeFn) {
  MirroredStrategy s(cpus(n()));
  int sum = 0;
  s.run([&] {
    get_replica_context()->merge_call(
        [&](Strategy&, const PerReplica<int>& v) {
          for (int x : v.values()) sum += x;
        },
        id());
  });
  EXPECT_EQ(sum, n() * (n() - 1) / 2);
}

TEST_P(MergeCallTest, ExceptionInMergeFnSurfacesFromRunWithItsType) {
  MirroredStrategy s(cpus(n()));
  std::vector<std::optional<testing::Seen>> seen(n());
  try {
    s.run([&] {
      testing::recording(seen[id()], [] {
        return get_replica_context()->merge_call([](Strategy&) -> int { throw std::logic_error("merge failed"); });
      });
    });
    FAIL() << "run did not throw";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "merge failed");
  }
  // Replica 0 ran merge_fn and saw the error itself; the others were released with AbortedError.
  for (int r = 1; r < n(); ++r) {
    ASSERT_TRUE(seen[r].has_value());
    EXPECT_EQ(seen[r]->type, "AbortedError");
    EXPECT_THAT(seen[r]->what, HasSubstr("merge failed"));
  }
  auto out = s.run(
      [] { return get_replica_context()->merge_call([](Strategy&, const PerReplica<int>& v) { return v[0]; }, 5); });
  EXPECT_EQ(out[0], 5);
}

TEST_P(MergeCallTest, RunAndCollectivesInsideMergeFnAreRejected) {
  MirroredStrategy s(cpus(n()));
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    return ctx->merge_call([&](Strategy& st) {
      return std::make_pair(message_of<FailedPreconditionError>([&] { st.run([] {}); }),
                            message_of<FailedPreconditionError>([&] { ctx->all_reduce(ReduceOp::SUM, 1); }));
    });
  });
  EXPECT_THAT(out[0].first, HasSubstr("inside a merge_call"));
  EXPECT_THAT(out[0].second, HasSubstr("outside the Strategy::run it belongs to"));
}

// docs/api.md §4 and §5: merge_fn runs in cross-replica context (in_cross_replica_context()
// true, get_replica_context() null), also in a scope it enters; the replica's context is back
// once merge_call returns or throws.
TEST_P(MergeCallTest, CrossReplicaContextInsideMergeFnOnlyAndRestoredAfterwards) {
  MirroredStrategy s(cpus(n()));
  struct Seen {
    bool cross = false, null_ctx = false, cross_in_scope = false, null_in_scope = false, strategy = false;
  } seen;
  auto after = s.run([&] {
    ReplicaContext* mine = get_replica_context();
    get_replica_context()->merge_call([&](Strategy& st) {
      seen.cross = in_cross_replica_context();
      seen.null_ctx = get_replica_context() == nullptr;
      seen.strategy = &get_strategy() == &s && &st == &s;
      auto scope = st.scope();  // re-entering the same strategy is fine
      seen.cross_in_scope = in_cross_replica_context();
      seen.null_in_scope = get_replica_context() == nullptr;
    });
    return get_replica_context() == mine && !in_cross_replica_context() && &get_strategy() == &s;
  });
  EXPECT_TRUE(seen.cross);
  EXPECT_TRUE(seen.null_ctx);
  EXPECT_TRUE(seen.strategy);
  EXPECT_TRUE(seen.cross_in_scope);
  EXPECT_TRUE(seen.null_in_scope);
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(after[r]) << "replica " << r;
  // After a merge_fn that threw, on the replica that ran it.
  std::optional<bool> restored;
  EXPECT_THROW(s.run([&] {
    ReplicaContext* mine = get_replica_context();
    try {
      get_replica_context()->merge_call([](Strategy&) { throw std::logic_error("merge failed"); });
    } catch (...) {
      if (id() == 0) restored = get_replica_context() == mine && !in_cross_replica_context();
      throw;
    }
  }),
               std::logic_error);
  ASSERT_TRUE(restored.has_value());
  EXPECT_TRUE(*restored);
}

TEST(MergeCallContext, DefaultStrategyMergeFnIsInCrossReplicaContext) {
  Strategy& d = get_strategy();
  ASSERT_FALSE(has_strategy());
  auto probe = [&] {
    return get_replica_context()->merge_call([&](Strategy& st) {
      return std::make_tuple(in_cross_replica_context(), get_replica_context() == nullptr, &st == &d);
    });
  };
  // Outside any scope (the default replica context), inside the default strategy's run, and
  // inside its scope's run.
  EXPECT_EQ(probe(), std::make_tuple(true, true, true));
  EXPECT_EQ(d.run(probe)[0], std::make_tuple(true, true, true));
  {
    auto scope = d.scope();
    EXPECT_EQ(d.run(probe)[0], std::make_tuple(true, true, true));
  }
  EXPECT_FALSE(in_cross_replica_context());
  EXPECT_NE(get_replica_context(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Replicas, MergeCallTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored
