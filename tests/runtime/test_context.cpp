// Context rules: scopes, the default strategy, get_strategy / has_strategy / get_replica_context.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

TEST(Context, OutsideAnyScopeTheDefaultStrategyIsCurrent) {
  EXPECT_FALSE(has_strategy());
  EXPECT_FALSE(in_cross_replica_context());
  EXPECT_EQ(get_strategy().num_replicas_in_sync(), 1);
  ReplicaContext* ctx = get_replica_context();
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(ctx->replica_id_in_sync_group(), 0);
  EXPECT_EQ(ctx->num_replicas_in_sync(), 1);
  EXPECT_EQ(&ctx->strategy(), &get_strategy());
  EXPECT_EQ(get_strategy().extended().worker_devices(), std::vector<Device>{cpu0});
}

TEST(Context, ScopeEntersCrossReplicaContext) {
  MirroredStrategy s(cpus(2));
  {
    auto scope = s.scope();
    EXPECT_TRUE(has_strategy());
    EXPECT_EQ(&get_strategy(), &s);
    EXPECT_TRUE(in_cross_replica_context());
    EXPECT_EQ(get_replica_context(), nullptr);
    {
      auto again = s.scope();  // re-entering the same strategy is fine
      EXPECT_EQ(&get_strategy(), &s);
    }
    EXPECT_EQ(&get_strategy(), &s);
  }
  EXPECT_FALSE(has_strategy());
  EXPECT_NE(get_replica_context(), nullptr);
}

TEST(Context, ScopesAreThreadLocal) {
  MirroredStrategy s(cpus(2));
  auto scope = s.scope();
  bool other_thread_has_strategy = true;
  std::thread([&] { other_thread_has_strategy = has_strategy(); }).join();
  EXPECT_FALSE(other_thread_has_strategy);
}

TEST(Context, MovedScopeExitsOnce) {
  MirroredStrategy s(cpus(2));
  {
    auto a = s.scope();
    Scope b(std::move(a));
    EXPECT_EQ(&get_strategy(), &s);
  }
  EXPECT_FALSE(has_strategy());
}

TEST(Context, MixingStrategiesIsRejected) {
  MirroredStrategy a(cpus(2));
  MirroredStrategy b(cpus(3));
  auto scope = a.scope();
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { auto inner = b.scope(); }),
              HasSubstr("Mixing different tf.distribute.Strategy objects"));
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { b.run([] {}); }),
              HasSubstr("Mixing different tf.distribute.Strategy objects"));
  EXPECT_EQ(&get_strategy(), &a);  // a failed entry leaves the stack as it was
}

TEST(Context, RunEntersTheStrategysScopeForTheReplicas) {
  MirroredStrategy s(cpus(2));
  EXPECT_FALSE(has_strategy());
  auto same = s.run([&] { return &get_strategy() == &s; });
  EXPECT_TRUE(same[0] && same[1]);
  EXPECT_FALSE(has_strategy());  // and leaves it afterwards
}

TEST(Context, DefaultStrategyRunsInlineWithOneReplica) {
  Strategy& d = get_strategy();
  const auto caller = std::this_thread::get_id();
  auto out = d.run([&](int x) { return std::make_pair(x * 2, std::this_thread::get_id() == caller); }, 21);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].first, 42);
  EXPECT_TRUE(out[0].second);
  // Collectives of one replica are identities.
  ReplicaContext* ctx = get_replica_context();
  EXPECT_EQ(ctx->all_reduce(ReduceOp::SUM, Tensor<float>{1, 2}).to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(ctx->all_reduce("mean", 3.0), 3.0);
  EXPECT_EQ(ctx->all_gather(Tensor<int32_t>{4, 5}, 0).to_vector(), (std::vector<int32_t>{4, 5}));
  bool cross = false;
  const int merged = ctx->merge_call(
      [&](Strategy& st, const PerReplica<int>& v) {
        cross = in_cross_replica_context() && &st == &d;
        return v[0] + 1;
      },
      9);
  EXPECT_EQ(merged, 10);
  EXPECT_TRUE(cross);
  EXPECT_FALSE(in_cross_replica_context());
  // One replica: SUM of a plain value is the value.
  EXPECT_EQ(d.reduce(ReduceOp::SUM, 5.0, std::nullopt), 5.0);
}

TEST(Context, DefaultStrategyScope) {
  {
    auto scope = get_strategy().scope();
    EXPECT_FALSE(has_strategy());
    EXPECT_TRUE(in_cross_replica_context());
    // A real strategy may still be entered inside the default one.
    MirroredStrategy s(cpus(2));
    auto inner = s.scope();
    EXPECT_EQ(&get_strategy(), &s);
  }
  EXPECT_FALSE(in_cross_replica_context());
}

TEST(Context, MirroredStrategyBasics) {
  MirroredStrategy s({"/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"});
  EXPECT_EQ(s.num_replicas_in_sync(), 2);
  EXPECT_EQ(s.name(), "MirroredStrategy");
  EXPECT_EQ(s.extended().worker_devices()[1].to_string(), "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(s.extended().cross_device_ops().name(), "InProcessAllReduce");
  MirroredStrategy r(cpus(2), std::make_shared<ReductionToOneDevice>());
  EXPECT_EQ(r.extended().cross_device_ops().name(), "ReductionToOneDevice");
}

TEST(Context, ExperimentalLocalResults) {
  MirroredStrategy s(cpus(3));
  auto v = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return c.replica_id_in_sync_group * 100 + c.num_replicas_in_sync; });
  EXPECT_EQ(s.experimental_local_results(v), (std::vector<int>{3, 103, 203}));
  EXPECT_EQ(s.experimental_local_results(7), (std::vector<int>{7}));
  Mirrored<double> m(std::vector<double>{1.5, 1.5, 1.5});
  EXPECT_EQ(s.experimental_local_results(m), (std::vector<double>{1.5, 1.5, 1.5}));
}

// docs/api.md §4: experimental_local_results of a variable gives its per-replica components
// (it once gave {variable}, as for a value that is not distributed).
TEST(Context, ExperimentalLocalResultsOfAVariableAreItsComponents) {
  MirroredStrategy s(cpus(3));
  auto scope = s.scope();
  Variable<float> v(Tensor<float>{1, 2});
  v.assign(s.experimental_distribute_values_from_function([](const ValueContext& c) {
    return Tensor<float>{float(c.replica_id_in_sync_group), 10};
  }));
  const std::vector<Variable<float>> parts = s.experimental_local_results(v);
  ASSERT_EQ(parts.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(parts[r].value().to_vector(), (std::vector<float>{float(r), 10})) << "replica " << r;
    EXPECT_EQ(parts[r].value().device(), s.extended().worker_devices()[r]);
    EXPECT_EQ(parts[r].num_components(), 1u);
    EXPECT_FALSE(parts[r] == v);
  }
  // Each is that copy alone: a write through it changes no other copy.
  Variable<float> second = parts[1];
  second.assign(Tensor<float>{7, 7});
  EXPECT_EQ(v.components()[0].to_vector(), (std::vector<float>{0, 10}));
  EXPECT_EQ(v.components()[1].to_vector(), (std::vector<float>{7, 7}));
  EXPECT_EQ(v.components()[2].to_vector(), (std::vector<float>{2, 10}));
  // Sync-on-read variables too; a component, or a plain variable, is its own only component.
  Variable<int32_t> counter(
      0, VariableOptions{"counter", std::nullopt, VariableSynchronization::ON_READ, VariableAggregation::SUM});
  EXPECT_EQ(s.experimental_local_results(counter).size(), 3u);
  EXPECT_TRUE(s.experimental_local_results(parts[2]) == std::vector<Variable<float>>{parts[2]});
}

TEST(Context, ExperimentalLocalResultsOfAPlainVariableIsItself) {
  Variable<float> plain(3.0f);
  ASSERT_EQ(plain.strategy(), nullptr);
  MirroredStrategy s(cpus(2));
  const auto parts = s.experimental_local_results(plain);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(parts[0] == plain);
}

TEST(Context, DistributeValuesCallsTheFunctionInReplicaOrderOnTheCaller) {
  MirroredStrategy s(cpus(4));
  std::vector<int> order;
  const auto caller = std::this_thread::get_id();
  bool on_caller = true;
  auto v = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    order.push_back(c.replica_id_in_sync_group);
    on_caller &= std::this_thread::get_id() == caller;
    return Tensor<float>::scalar(float(c.replica_id_in_sync_group));
  });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(on_caller);
  EXPECT_EQ(v[3].item(), 3.0f);
}

TEST(Context, CollectiveTimeoutSettings) {
  MirroredStrategy s(cpus(2));
  EXPECT_EQ(s.extended().collective_timeout_seconds(), 1800.0);
  s.extended().set_collective_timeout_seconds(2.5);
  EXPECT_EQ(s.extended().collective_timeout_seconds(), 2.5);
  EXPECT_THROW(s.extended().set_collective_timeout_seconds(0), InvalidArgumentError);
  ::setenv("MIRRORED_COLLECTIVE_TIMEOUT_S", "0.75", 1);
  MirroredStrategy t(cpus(2));
  ::unsetenv("MIRRORED_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(t.extended().collective_timeout_seconds(), 0.75);
}

// The default deadline may be changed while replicas read it in their collectives (a data race
// before it was atomic: TSan reports it).
TEST(Context, CollectiveTimeoutCanChangeDuringARun) {
  MirroredStrategy s(cpus(2));
  std::atomic<bool> done{false};
  std::thread setter([&] {
    for (int i = 0; !done.load(); ++i) s.extended().set_collective_timeout_seconds(100.0 + i % 7);
  });
  float total = 0;
  for (int step = 0; step < 200; ++step) {
    auto out = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
    total += out[0] + out[1];
  }
  done = true;
  setter.join();
  EXPECT_EQ(total, 800.0f);
  const double t = s.extended().collective_timeout_seconds();
  EXPECT_GE(t, 100.0);
  EXPECT_LE(t, 106.0);
}

}  // namespace
}  // namespace mirrored
