// Strategy::experimental_distribute_dataset: exact per-replica contents under both split rules,
// the seed's sample, tuples, element specs, the iterator API, placement and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using data::TensorSpec;
using testing::collect_steps;
using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Steps;

// ---- exact contents ------------------------------------------------------------------------

struct SplitCase {
  const char* name;
  int64_t elements, batch;
  bool drop;
  int replicas;
  RebatchPolicy policy;
  Steps expected;
};

void PrintTo(const SplitCase& c, std::ostream* os) { *os << c.name; }

class DataSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(DataSplit, ExactPerReplicaContents) {
  const SplitCase& c = GetParam();
  MirroredStrategy strategy(cpus(c.replicas));
  InputOptions o;
  o.rebatch_policy = c.policy;
  auto dist = strategy.experimental_distribute_dataset(data::range(c.elements).batch(c.batch, c.drop), o);
  EXPECT_EQ(collect_steps(dist), c.expected);
  EXPECT_EQ(collect_steps(dist), c.expected);  // a second epoch is the same
}

constexpr auto B = RebatchPolicy::BALANCED;
constexpr auto C = RebatchPolicy::CEIL;

Steps tens_of_100() {
  Steps s;
  for (int64_t k = 0; k < 10; ++k) {
    testing::Rows a, b;
    for (int64_t i = 0; i < 5; ++i) {
      a.push_back(10 * k + i);
      b.push_back(10 * k + 5 + i);
    }
    s.push_back({a, b});
  }
  return s;
}

// clang-format off
INSTANTIATE_TEST_SUITE_P(
    DataContract, DataSplit,
    ::testing::Values(
        SplitCase{"range9_batch2_on2_balanced", 9, 2, false, 2, B,
                  {{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{6}, {7}}, {{8}, {}}}},
        SplitCase{"range9_batch2_on2_ceil", 9, 2, false, 2, C,
                  {{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{6}, {7}}, {{8}, {}}}},
        SplitCase{"range9_batch2_drop_on2_balanced", 9, 2, true, 2, B, {{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{6}, {7}}}},
        SplitCase{"range9_batch2_drop_on2_ceil", 9, 2, true, 2, C, {{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{6}, {7}}}},
        SplitCase{"range100_batch10_on2_balanced", 100, 10, false, 2, B, tens_of_100()},
        SplitCase{"range100_batch10_on2_ceil", 100, 10, false, 2, C, tens_of_100()},
        SplitCase{"range6_batch4_on2_balanced", 6, 4, false, 2, B, {{{0, 1}, {2, 3}}, {{4}, {5}}}},
        SplitCase{"range6_batch4_on2_ceil", 6, 4, false, 2, C, {{{0, 1}, {2, 3}}, {{4}, {5}}}},
        SplitCase{"range8_batch4_on3_balanced", 8, 4, false, 3, B, {{{0, 1}, {2}, {3}}, {{4, 5}, {6}, {7}}}},
        SplitCase{"range8_batch4_on3_ceil", 8, 4, false, 3, C, {{{0, 1}, {2, 3}, {}}, {{4, 5}, {6, 7}, {}}}},
        SplitCase{"range4_batch4_on5_balanced", 4, 4, false, 5, B, {{{0}, {1}, {2}, {3}, {}}}},
        SplitCase{"range4_batch4_on5_ceil", 4, 4, false, 5, C, {{{0}, {1}, {2}, {3}, {}}}},
        SplitCase{"range7_batch5_on3_balanced", 7, 5, false, 3, B, {{{0, 1}, {2, 3}, {4}}, {{5}, {6}, {}}}},
        SplitCase{"range7_batch5_on3_ceil", 7, 5, false, 3, C, {{{0, 1}, {2, 3}, {4}}, {{5}, {6}, {}}}}),
    [](const auto& info) { return std::string(info.param.name); });
// clang-format on

TEST(DataDistribute, SplitRuleHelpers) {
  using data::detail::batch_sizes_for_worker;
  EXPECT_EQ(batch_sizes_for_worker(4, 1, 3, 0), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(batch_sizes_for_worker(10, 2, 2, 0), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(batch_sizes_for_worker(10, 2, 2, 1), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(batch_sizes_for_worker(4, 1, 5, 0), (std::vector<int64_t>{1, 1, 1, 1, 0}));
  EXPECT_THROW(batch_sizes_for_worker(4, 2, 2, 2), InvalidArgumentError);
}

// ---- the seed's sample ---------------------------------------------------------------------

TEST(DataDistribute, SeedSampleRange4Batch2OnTwoReplicas) {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  auto dist_dataset = strategy.experimental_distribute_dataset(data::Dataset<>::range(4).batch(2));
  auto replica_fn = [](const Tensor<int64_t>& input) { return input * 2; };
  std::vector<PerReplica<Tensor<int64_t>>> result;
  for (const auto& x : dist_dataset) result.push_back(strategy.run(replica_fn, x));
  ASSERT_EQ(result.size(), 2u);
  EXPECT_EQ(repr(result[0]),
            "PerReplica:{\n  0: <Tensor: shape=(1,), dtype=int64, value=[0]>,\n  1: <Tensor: shape=(1,), dtype=int64, "
            "value=[2]>\n}");
  EXPECT_EQ(repr(result[1]),
            "PerReplica:{\n  0: <Tensor: shape=(1,), dtype=int64, value=[4]>,\n  1: <Tensor: shape=(1,), dtype=int64, "
            "value=[6]>\n}");
}

// ---- tuples, specs, placement ----------------------------------------------------------------

TEST(DataDistribute, FeaturesAndLabelsAreSplitTogether) {
  MirroredStrategy strategy(cpus(2));
  std::vector<float> features(10);
  for (int i = 0; i < 10; ++i) features[i] = float(i);
  auto ds =
      data::from_tensor_slices(Tensor<float>::from_vector(features, {5, 2}), Tensor<int32_t>({0, 1, 2, 3, 4})).batch(4);
  auto dist = strategy.experimental_distribute_dataset(ds);
  std::vector<std::vector<std::pair<std::vector<float>, std::vector<int32_t>>>> seen;
  for (const auto& step : dist) {
    seen.emplace_back();
    for (const auto& [x, y] : step.values()) seen.back().emplace_back(x.to_vector(), y.to_vector());
  }
  using P = std::pair<std::vector<float>, std::vector<int32_t>>;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (std::vector<P>{{{0, 1, 2, 3}, {0, 1}}, {{4, 5, 6, 7}, {2, 3}}}));
  // The partial batch has one row for two replicas: the second gets an empty batch.
  EXPECT_EQ(seen[1], (std::vector<P>{{{8, 9}, {4}}, {{}, {}}}));
  auto spec = dist.element_spec();
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(std::get<0>(spec[1]), (TensorSpec{{-1, 2}, DType::float32}));
  EXPECT_EQ(std::get<1>(spec[1]), (TensorSpec{{-1}, DType::int32}));
  // The empty batch keeps the feature width.
  auto it = dist.begin();
  it.get_next();
  EXPECT_EQ(std::get<0>(it.get_next()[1]).shape(), (Shape{0, 2}));
}

TEST(DataDistribute, ElementSpecKnowsEvenSplits) {
  MirroredStrategy two(cpus(2)), three(cpus(3));
  EXPECT_EQ(two.experimental_distribute_dataset(data::range(8).batch(4, true)).element_spec()[0],
            (TensorSpec{{2}, DType::int64}));
  EXPECT_EQ(three.experimental_distribute_dataset(data::range(8).batch(4, true)).element_spec()[2],
            (TensorSpec{{-1}, DType::int64}));
  EXPECT_EQ(two.experimental_distribute_dataset(data::range(8).batch(4)).element_spec()[1],
            (TensorSpec{{-1}, DType::int64}));
  EXPECT_EQ(repr(two.experimental_distribute_dataset(data::range(8).batch(4, true)).element_spec()),
            "PerReplica:{\n  0: TensorSpec(shape=(2,), dtype=int64),\n  1: TensorSpec(shape=(2,), dtype=int64)\n}");
  auto dist = two.experimental_distribute_dataset(data::range(8).batch(4, true));
  EXPECT_EQ(dist.begin().element_spec()[0], (TensorSpec{{2}, DType::int64}));
}

TEST(DataDistribute, ComponentsLiveOnTheReplicaDevices) {
  MirroredStrategy strategy(cpus(3));
  const auto& devices = strategy.extended().worker_devices();
  for (const auto& step : strategy.experimental_distribute_dataset(data::range(6).batch(3)))
    for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(step[r].device(), devices[r]);
  InputOptions host;
  host.experimental_fetch_to_device = false;
  for (const auto& step : strategy.experimental_distribute_dataset(data::range(6).batch(3), host))
    for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(step[r].device(), cpu0);
}

TEST(DataDistribute, OneReplicaPassesElementsThroughUnsplit) {
  MirroredStrategy one({"CPU:0"});
  std::vector<int64_t> seen;
  for (const auto& step : one.experimental_distribute_dataset(data::range(3))) seen.push_back(step[0].item());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(collect_steps(one.experimental_distribute_dataset(data::range(5).batch(2))),
            (Steps{{{0, 1}}, {{2, 3}}, {{4}}}));
}

// ---- iterator API ----------------------------------------------------------------------------

TEST(DataDistribute, GetNextAndOptional) {
  MirroredStrategy strategy(cpus(2));
  auto dist = strategy.experimental_distribute_dataset(data::range(4).batch(2));
  auto it = dist.begin();
  EXPECT_EQ(it.get_next()[1].to_vector(), (std::vector<int64_t>{1}));
  auto second = it.get_next_as_optional();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ((*second)[0].to_vector(), (std::vector<int64_t>{2}));
  EXPECT_FALSE(it.get_next_as_optional().has_value());
  EXPECT_THAT(message_of<OutOfRangeError>([&] { it.get_next(); }), HasSubstr("End of sequence"));
  EXPECT_TRUE(it == std::default_sentinel);
  // Mixing the range protocol with get_next.
  auto it2 = dist.begin();
  EXPECT_EQ((*it2)[0].to_vector(), (std::vector<int64_t>{0}));
  EXPECT_EQ(it2.get_next()[0].to_vector(), (std::vector<int64_t>{0}));  // the step * showed
  EXPECT_EQ((*it2)[0].to_vector(), (std::vector<int64_t>{2}));
  ++it2;
  EXPECT_TRUE(it2 == std::default_sentinel);
}

TEST(DataDistribute, WithoutPrefetchBuffer) {
  MirroredStrategy strategy(cpus(2));
  InputOptions o;
  o.experimental_per_replica_buffer_size = 0;
  EXPECT_EQ(collect_steps(strategy.experimental_distribute_dataset(data::range(6).batch(4), o)),
            (Steps{{{0, 1}, {2, 3}}, {{4}, {5}}}));
  o.experimental_per_replica_buffer_size = 3;
  EXPECT_EQ(collect_steps(strategy.experimental_distribute_dataset(data::range(6).batch(4), o)),
            (Steps{{{0, 1}, {2, 3}}, {{4}, {5}}}));
}

struct InputFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(DataDistribute, MapExceptionSurfacesFromGetNextWithItsType) {
  MirroredStrategy strategy(cpus(2));
  auto ds = data::range(10)
                .map([](const Tensor<int64_t>& x) {
                  if (x.item() == 5) throw InputFailure("element 5 is corrupt");
                  return x;
                })
                .batch(2);
  for (int buffer : {0, 1, 4}) {
    InputOptions o;
    o.experimental_per_replica_buffer_size = buffer;
    auto it = strategy.experimental_distribute_dataset(ds, o).begin();
    EXPECT_EQ(it.get_next()[0].to_vector(), (std::vector<int64_t>{0}));
    EXPECT_EQ(it.get_next()[0].to_vector(), (std::vector<int64_t>{2}));
    EXPECT_THAT(message_of<InputFailure>([&] { it.get_next(); }), HasSubstr("element 5 is corrupt")) << buffer;
    EXPECT_FALSE(it.get_next_as_optional().has_value());
  }
}

TEST(DataDistribute, AbandonedIteratorsDoNotHang) {
  MirroredStrategy strategy(cpus(2));
  auto endless = strategy.experimental_distribute_dataset(data::range(4).repeat().batch(2).prefetch(2));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto it = endless.begin();
    it.get_next();
  }
  for (int i = 0; i < 5; ++i) auto unused = endless.begin();  // never read
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(DataDistribute, NextStepIsPreparedWhileTheCurrentOneRuns) {
  MirroredStrategy strategy(cpus(2));
  constexpr auto kInput = std::chrono::milliseconds(60);
  auto slow = data::range(8)
                  .map([&](const Tensor<int64_t>& x) {
                    std::this_thread::sleep_for(kInput);
                    return x;
                  })
                  .batch(2);
  auto it = strategy.experimental_distribute_dataset(slow).begin();
  it.get_next();
  std::this_thread::sleep_for(kInput * 4);  // "compute": the producer fills the buffer meanwhile
  const auto t0 = std::chrono::steady_clock::now();
  it.get_next();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, kInput) << "the second step was not prefetched";
}

// ---- errors ----------------------------------------------------------------------------------

TEST(DataDistribute, UnbatchedElementsAskForBatch) {
  MirroredStrategy strategy(cpus(2));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { strategy.experimental_distribute_dataset(data::range(4)); }),
              HasSubstr("batch the dataset first"));
  // Known only while iterating (map hides the shape).
  auto hidden = data::range(4).map([](const Tensor<int64_t>& x) { return x; });
  auto dist = strategy.experimental_distribute_dataset(hidden);
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { collect_steps(dist); }), HasSubstr("batch the dataset first"));
}

TEST(DataDistribute, BadInputOptions) {
  MirroredStrategy strategy(cpus(2));
  InputOptions o;
  o.experimental_per_replica_buffer_size = -1;
  EXPECT_THAT(
      message_of<InvalidArgumentError>([&] { strategy.experimental_distribute_dataset(data::range(4).batch(2), o); }),
      HasSubstr("experimental_per_replica_buffer_size must be >= 0 (got -1)"));
  InputOptions per_replica;
  per_replica.experimental_replication_mode = InputReplicationMode::PER_REPLICA;
  EXPECT_THAT(message_of<InvalidArgumentError>(
                  [&] { strategy.experimental_distribute_dataset(data::range(4).batch(2), per_replica); }),
              HasSubstr("only supported in `distribute_datasets_from_function`"));
}

TEST(DataDistribute, MismatchedComponentBatchSizes) {
  MirroredStrategy strategy(cpus(2));
  auto ds = data::range(4).batch(2).map([](const Tensor<int64_t>& x) {
    return std::make_tuple(x, Tensor<int64_t>({1, 2, 3}));
  });
  auto dist = strategy.experimental_distribute_dataset(ds);
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                for (const auto& step : dist) (void)step;
              }),
              HasSubstr("differ in their first dimension"));
}

}  // namespace
}  // namespace mirrored
