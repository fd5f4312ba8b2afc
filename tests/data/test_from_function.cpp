// Strategy::distribute_datasets_from_function: InputContext, round-robin dealing, PER_WORKER and
// PER_REPLICA modes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::collect_steps;
using testing::cpu_devices;
using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Steps;

TEST(DataFromFunction, InputContext) {
  const InputContext ctx(1, 0, 2);
  EXPECT_EQ(ctx.get_per_replica_batch_size(8), 4);
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { ctx.get_per_replica_batch_size(7); }),
            "The `global_batch_size` 7 is not divisible by `num_replicas_in_sync` 2");
  const InputContext defaults;
  EXPECT_EQ(defaults.num_input_pipelines, 1);
  EXPECT_EQ(defaults.input_pipeline_id, 0);
  EXPECT_EQ(defaults.num_replicas_in_sync, 1);
  EXPECT_THROW(InputContext(2, 2, 4), InvalidArgumentError);
  EXPECT_THROW(InputContext(1, 0, 0), InvalidArgumentError);
}

TEST(DataFromFunction, PerWorkerDealsWholeElementsRoundRobin) {
  MirroredStrategy strategy(cpus(2));
  std::vector<InputContext> calls;
  auto dist = strategy.distribute_datasets_from_function([&](const InputContext& ctx) {
    calls.push_back(ctx);
    return data::range(7).batch(ctx.get_per_replica_batch_size(4));
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].num_input_pipelines, 1);
  EXPECT_EQ(calls[0].input_pipeline_id, 0);
  EXPECT_EQ(calls[0].num_replicas_in_sync, 2);
  EXPECT_EQ(collect_steps(dist), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6}}}));
  EXPECT_EQ(collect_steps(dist), (Steps{{{0, 1}, {2, 3}}, {{4, 5}, {6}}}));  // next epoch
  EXPECT_EQ(calls.size(), 1u);                                               // the function builds the dataset once
}

TEST(DataFromFunction, ReplicasLeftWithoutAnElementGetAnEmptyBatch) {
  MirroredStrategy strategy(cpus(3));
  auto dist = strategy.distribute_datasets_from_function([](const InputContext&) { return data::range(5).batch(2); });
  EXPECT_EQ(collect_steps(dist), (Steps{{{0, 1}, {2, 3}, {4}}}));
  auto dist2 = strategy.distribute_datasets_from_function([](const InputContext&) { return data::range(8).batch(2); });
  EXPECT_EQ(collect_steps(dist2), (Steps{{{0, 1}, {2, 3}, {4, 5}}, {{6, 7}, {}, {}}}));
}

TEST(DataFromFunction, PerReplicaGivesEachReplicaItsOwnDataset) {
  MirroredStrategy strategy(cpus(2));
  InputOptions o;
  o.experimental_replication_mode = InputReplicationMode::PER_REPLICA;
  std::vector<int> ids, pipelines;
  auto dist = strategy.distribute_datasets_from_function(
      [&](const InputContext& ctx) {
        pipelines.push_back(ctx.num_input_pipelines);
        ids.push_back(ctx.input_pipeline_id);
        const int64_t start = 100 * ctx.input_pipeline_id;
        return data::range(start, start + 3 - ctx.input_pipeline_id).batch(1);
      },
      o);
  EXPECT_EQ(ids, (std::vector<int>{0, 1}));
  EXPECT_EQ(pipelines, (std::vector<int>{2, 2}));
  EXPECT_EQ(collect_steps(dist), (Steps{{{0}, {100}}, {{1}, {101}}, {{2}, {}}}));
}

TEST(DataFromFunction, PlacementAndElementSpec) {
  MirroredStrategy strategy(cpus(2));
  auto dist = strategy.distribute_datasets_from_function(
      [](const InputContext& ctx) { return data::range(8).batch(ctx.get_per_replica_batch_size(4), true); });
  EXPECT_EQ(dist.element_spec()[1], (data::TensorSpec{{2}, DType::int64}));
  for (const auto& step : dist)
    for (std::size_t r = 0; r < 2; ++r) EXPECT_EQ(step[r].device(), strategy.extended().worker_devices()[r]);
}

TEST(DataFromFunction, UnbatchedElementsAreDealtToo) {
  MirroredStrategy strategy(cpus(2));
  auto dist = strategy.distribute_datasets_from_function([](const InputContext&) { return data::range(5); });
  std::vector<std::vector<int64_t>> seen;
  for (const auto& step : dist) seen.push_back({step[0].item(), step[1].item()});
  // The final half step cannot be padded (rank 0): it is dropped with a warning.
  EXPECT_EQ(seen, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3}}));
}

TEST(DataFromFunction, SimulatedSecondWorker) {
  std::vector<InputContext> calls;
  auto fn = [&](const InputContext& ctx) {
    calls.push_back(ctx);
    return data::range(12).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2);
  };
  auto dist = data::detail::distribute_datasets_from_function(fn, cpu_devices(2), 2, 1, InputOptions{});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].num_input_pipelines, 2);
  EXPECT_EQ(calls[0].input_pipeline_id, 1);
  EXPECT_EQ(calls[0].num_replicas_in_sync, 4);
  EXPECT_EQ(collect_steps(dist), (Steps{{{1, 3}, {5, 7}}, {{9, 11}, {}}}));
}

TEST(DataFromFunction, BadOptions) {
  MirroredStrategy strategy(cpus(2));
  InputOptions o;
  o.experimental_per_replica_buffer_size = -2;
  EXPECT_THROW(strategy.distribute_datasets_from_function([](const InputContext&) { return data::range(2); }, o),
               InvalidArgumentError);
}

}  // namespace
}  // namespace mirrored
