// Checkpointable iterators: an iterator restored from a saved state yields exactly what the saved
// one would have yielded next, and later passes alike; wrong or corrupt state is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace iterstate_test {

using testing::cpu_devices;
using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Rows;
using testing::Steps;
using testing::TempDir;

// An element's values, whatever its type (tuple components one after the other).
template <class T>
Rows values_of(const Tensor<T>& t) {
  Rows out;
  for (T v : t.to_vector()) out.push_back(static_cast<int64_t>(v));
  return out;
}
template <class... Ts>
Rows values_of(const std::tuple<Tensor<Ts>...>& e) {
  Rows out;
  std::apply(
      [&](const auto&... t) {
        (
            [&] {
              Rows part = values_of(t);
              out.push_back(static_cast<int64_t>(part.size()));  // keeps component borders visible
              out.insert(out.end(), part.begin(), part.end());
            }(),
            ...);
      },
      e);
  return out;
}

// The rest of a pass.
template <class It>
std::vector<Rows> drain(It& it) {
  std::vector<Rows> out;
  while (auto e = it.next()) out.push_back(values_of(*e));
  return out;
}

template <class Ds>
std::vector<Rows> one_pass(const Ds& ds) {
  auto it = ds.begin();
  return drain(it);
}

std::vector<Rows> tail(const std::vector<Rows>& v, std::size_t k) {
  return std::vector<Rows>(v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
}

// For each k: k elements into the first pass of make(), save, restore into a fresh make(), and
// compare the rest and the next two passes with an uninterrupted run. The saved iterator itself
// goes on undisturbed.
template <class Make>
void expect_resumes(Make make, const std::vector<std::size_t>& ks) {
  const auto reference = make();
  const std::vector<Rows> first = one_pass(reference), second = one_pass(reference), third = one_pass(reference);
  for (std::size_t k : ks) {
    SCOPED_TRACE("k = " + std::to_string(k));
    ASSERT_LE(k, first.size());
    const auto saved_ds = make();
    auto it = saved_ds.begin();
    for (std::size_t i = 0; i < k; ++i) ASSERT_TRUE(it.next().has_value());
    const std::string state = it.save_state();
    EXPECT_EQ(drain(it), tail(first, k));

    const auto restored_ds = make();
    auto it2 = restored_ds.begin();
    it2.restore_state(state);
    EXPECT_EQ(drain(it2), tail(first, k));
    EXPECT_EQ(one_pass(restored_ds), second);
    EXPECT_EQ(one_pass(restored_ds), third);
  }
}

TEST(IteratorState, Range) {
  expect_resumes([] { return data::range(10); }, {0, 3, 9, 10});
  expect_resumes([] { return data::range(20, 0, -3); }, {0, 2, 7});
  expect_resumes([] { return data::range(5, 5); }, {0});
}

TEST(IteratorState, FromTensorSlices) {
  const auto features = Tensor<float>::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {5, 2});
  const auto labels = Tensor<int32_t>::from_vector({10, 11, 12, 13, 14}, {5});
  expect_resumes([&] { return data::from_tensor_slices(features, labels).batch(2); }, {0, 1, 3});
}

TEST(IteratorState, ShuffleMidBufferAndAtTheEnd) {
  // 50 elements through a buffer of 8: k = 3 is inside the first buffer's worth, 45 is after the
  // input ran out (only buffered elements left), 50 the end.
  expect_resumes([] { return data::range(50).shuffle(8, 7); }, {0, 1, 3, 20, 45, 49, 50});
}

TEST(IteratorState, ShuffleRepeatBatchPrefetch) {
  // 24 elements, batches of 4: an epoch is 6 batches, so k = 6 and 12 are epoch boundaries.
  expect_resumes([] { return data::range(24).shuffle(5, 1).repeat(3).batch(4).prefetch(2); },
                 {0, 1, 5, 6, 7, 12, 17, 18});
  // An epoch that ends inside a batch, a remainder, and a repeat after the prefetch.
  expect_resumes([] { return data::range(23).shuffle(6, 2).prefetch(3).repeat(2).batch(5); }, {0, 2, 4, 9, 10});
}

TEST(IteratorState, EndlessRepeatWithTake) {
  expect_resumes([] { return data::range(5).shuffle(5, 2).repeat().take(23); }, {0, 4, 5, 11, 22, 23});
}

TEST(IteratorState, TakeSkipShard) {
  expect_resumes([] { return data::range(100).skip(7).take(50).shard(3, 1); }, {0, 5, 16, 17});
  expect_resumes([] { return data::range(10).skip(-1); }, {0});
  expect_resumes([] { return data::range(10).take(-1).shard(4, 3); }, {0, 1, 2});
}

TEST(IteratorState, MapFilter) {
  expect_resumes(
      [] {
        return data::range(40)
            .map([](const Tensor<int64_t>& x) { return x * x; })
            .filter([](const Tensor<int64_t>& x) { return x.item() % 2 == 1; })
            .batch(3);
      },
      {0, 1, 6, 7});
}

TEST(IteratorState, NestedPrefetches) {
  expect_resumes([] { return data::range(30).prefetch(4).shuffle(6, 5).prefetch(1).batch(4).prefetch(3); },
                 {0, 1, 3, 7, 8});
}

class IteratorStateFiles : public ::testing::Test {
 protected:
  TempDir dir;
  std::vector<std::string> records{dir.write_int64s("a.bin", {0, 1, 2, 3, 4}), dir.write_int64s("b.bin", {}),
                                   dir.write_int64s("c.bin", {5, 6, 7})};
  std::vector<std::string> lines{dir.write("a.txt", "one\ntwo\r\nthree"), dir.write("b.txt", "\nfour\n")};
};

TEST_F(IteratorStateFiles, FixedLengthRecords) {
  expect_resumes([&] { return data::fixed_length_record_dataset(records, 8).map(testing::record_to_int64); },
                 {0, 2, 5, 6, 8});
  expect_resumes(
      [&] {
        return data::fixed_length_record_dataset(records, 8).map(testing::record_to_int64).shuffle(3, 4).batch(2);
      },
      {0, 1, 3, 4});
}

TEST_F(IteratorStateFiles, HeaderAndFooter) {
  const std::string framed = dir.write("framed.bin", std::string("HDR") + std::string(16, 'x') + "FT");
  expect_resumes([&] { return data::fixed_length_record_dataset({framed, framed}, 4, 3, 2); }, {0, 3, 4, 5, 8});
}

TEST_F(IteratorStateFiles, TextLines) {
  expect_resumes([&] { return data::text_line_dataset(lines); }, {0, 1, 2, 3, 4, 5});
  expect_resumes([&] { return data::text_line_dataset(lines).prefetch(2).repeat(2); }, {0, 4, 7, 10});
}

TEST_F(IteratorStateFiles, AFileTooShortForTheSavedPositionIsRefused) {
  const std::string path = dir.write_int64s("short.bin", {0, 1, 2, 3});
  auto it = data::fixed_length_record_dataset({path}, 8).begin();
  it.next();
  const std::string state = it.save_state();
  dir.write_int64s("short.bin", {0, 1});  // rewritten with fewer records
  auto it2 = data::fixed_length_record_dataset({path}, 8).begin();
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { it2.restore_state(state); }),
              HasSubstr("has 2 records, fewer than the 3 left to read"));
}

TEST(IteratorState, AStateSavedInALaterPassKeepsThatPassAndTheOnesAfter) {
  const auto make = [] { return data::range(12).shuffle(12, 5).batch(5); };
  const auto reference = make();
  std::vector<std::vector<Rows>> passes;
  for (int p = 0; p < 4; ++p) passes.push_back(one_pass(reference));
  ASSERT_NE(passes[2], passes[1]);  // each pass is reshuffled
  const auto saved_ds = make();
  one_pass(saved_ds);
  one_pass(saved_ds);
  auto it = saved_ds.begin();  // the third pass
  it.next();
  const std::string state = it.save_state();
  const auto restored_ds = make();  // has opened no pass yet
  auto it2 = restored_ds.begin();
  it2.restore_state(state);
  EXPECT_EQ(drain(it2), tail(passes[2], 1));
  EXPECT_EQ(one_pass(restored_ds), passes[3]);
}

TEST(IteratorState, AnElementLookedAtButNotConsumedIsKept) {
  const auto ds = data::range(10).shuffle(4, 3).prefetch(2);
  const std::vector<Rows> all = one_pass(data::range(10).shuffle(4, 3).prefetch(2));
  auto it = ds.begin();
  it.next();
  EXPECT_EQ(values_of(*it), all[1]);  // fetched, not consumed
  const std::string state = it.save_state();
  auto it2 = data::range(10).shuffle(4, 3).prefetch(2).begin();
  it2.restore_state(state);
  EXPECT_EQ(drain(it2), tail(all, 1));
}

TEST(IteratorState, AnEndedIteratorRestoresEnded) {
  auto it = data::range(3).begin();
  EXPECT_EQ(drain(it).size(), 3u);
  const std::string state = it.save_state();
  auto it2 = data::range(3).begin();
  it2.restore_state(state);
  EXPECT_FALSE(it2.next().has_value());
}

TEST(IteratorState, AnotherPipelineIsRefusedNamingBoth) {
  auto it = data::range(10).batch(4).begin();
  const std::string state = it.save_state();
  auto other = data::range(10).batch(8).begin();
  const std::string msg = message_of<InvalidArgumentError>([&] { other.restore_state(state); });
  EXPECT_THAT(msg, HasSubstr("range(0, 10, 1).batch(4, drop_remainder=false)"));
  EXPECT_THAT(msg, HasSubstr("restoring into range(0, 10, 1).batch(8, drop_remainder=false)"));
  auto seeded = data::range(10).shuffle(3, 1).begin();
  EXPECT_THAT(
      message_of<InvalidArgumentError>(
          [&] { data::range(10).shuffle(3, 2).begin().restore_state(seeded.save_state()); }),
      HasSubstr("shuffle(buffer_size=3, seed=1), restoring into range(0, 10, 1).shuffle(buffer_size=3, seed=2)"));
}

TEST(IteratorState, CorruptOrTruncatedStateIsRefusedAndChangesNothing) {
  const auto make = [] { return data::range(40).shuffle(6, 9).batch(3).prefetch(2); };
  const std::vector<Rows> all = one_pass(make());
  auto saved = make().begin();
  for (int i = 0; i < 4; ++i) saved.next();
  const std::string state = saved.save_state();

  auto it = make().begin();
  it.next();
  it.next();
  for (std::size_t n = 0; n < state.size(); ++n) {
    SCOPED_TRACE("truncated to " + std::to_string(n));
    EXPECT_THROW(it.restore_state(state.substr(0, n)), InvalidArgumentError);
  }
  EXPECT_THROW(it.restore_state(state + "x"), InvalidArgumentError);
  EXPECT_THROW(it.restore_state(std::string(100, '\xff')), InvalidArgumentError);
  // A flipped byte either still reads as a state (a different position) or is refused as
  // corrupt; never another error, never a crash.
  for (std::size_t i = 0; i < state.size(); ++i) {
    std::string bad = state;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    auto victim = make().begin();
    try {
      victim.restore_state(bad);
    } catch (const InvalidArgumentError&) {
    }
  }
  // The failed restores left `it` where it was.
  EXPECT_EQ(drain(it), tail(all, 2));
}

TEST(IteratorState, AnIteratorNotMadeByBeginCannotSave) {
  data::Dataset<>::Iterator it;
  EXPECT_THROW(it.save_state(), FailedPreconditionError);
}

// A source that knows nothing of iterator state.
class CountingNode final : public data::detail::Node<Tensor<int64_t>> {
 public:
  CountingNode() : Node({data::TensorSpec{{}, DType::int64}}, {}) {}
  std::unique_ptr<data::detail::Cursor<Tensor<int64_t>>> open(const data::detail::OpenContext&) const override {
    struct C final : data::detail::Cursor<Tensor<int64_t>> {
      int64_t n = 0;
      std::optional<Tensor<int64_t>> next() override {
        if (n == 3) return std::nullopt;
        return Tensor<int64_t>::scalar(n++);
      }
    };
    return std::make_unique<C>();
  }
};

TEST(IteratorState, ACustomNodeWithoutStateSaysSoByName) {
  const data::Dataset<Tensor<int64_t>> ds(std::make_shared<CountingNode>());
  auto it = ds.batch(2).begin();
  EXPECT_THAT(message_of<UnimplementedError>([&] { it.save_state(); }),
              HasSubstr("CountingNode does not support iterator state"));
  EXPECT_EQ(drain(it), (std::vector<Rows>{{0, 1}, {2}}));  // unaffected
}

// ---------------------------------------------------------------------------------------------
// Distributed iterators.

std::vector<Rows> step_values(const PerReplica<Tensor<int64_t>>& step) {
  std::vector<Rows> out;
  for (const auto& t : step.values()) out.push_back(t.to_vector());
  return out;
}

template <class It>
Steps drain_steps(It& it) {
  Steps out;
  while (auto step = it.get_next_as_optional()) out.push_back(step_values(*step));
  return out;
}

template <class Dist>
Steps pass_of(const Dist& dd) {
  auto it = dd.begin();
  return drain_steps(it);
}

// As expect_resumes, for a distributed dataset made by make().
template <class Make>
void expect_distributed_resumes(Make make, const std::vector<std::size_t>& ks) {
  const auto reference = make();
  const Steps first = pass_of(reference), second = pass_of(reference);
  for (std::size_t k : ks) {
    SCOPED_TRACE("k = " + std::to_string(k));
    ASSERT_LE(k, first.size());
    const auto saved_dd = make();
    auto it = saved_dd.begin();
    for (std::size_t i = 0; i < k; ++i) ASSERT_TRUE(it.get_next_as_optional().has_value());
    const std::string state = it.save_state();
    EXPECT_EQ(drain_steps(it), Steps(first.begin() + static_cast<std::ptrdiff_t>(k), first.end()));

    const auto restored_dd = make();
    auto it2 = restored_dd.begin();
    it2.get_next_as_optional();  // a pass under way is replaced
    it2.restore_state(state);
    EXPECT_EQ(drain_steps(it2), Steps(first.begin() + static_cast<std::ptrdiff_t>(k), first.end()));
    EXPECT_EQ(pass_of(restored_dd), second);
  }
}

data::Dataset<Tensor<int64_t>> shuffled_batches() {
  return data::range(30).shuffle(7, 11).repeat(2).batch(8).prefetch(2);
}

TEST(DistributedIteratorState, DistributeDatasetTwoAndFourReplicas) {
  for (int replicas : {2, 4}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas");
    MirroredStrategy strategy(cpus(replicas));
    for (int buffer : {0, 1, 3}) {
      SCOPED_TRACE("buffer " + std::to_string(buffer));
      InputOptions o;
      o.experimental_per_replica_buffer_size = buffer;
      expect_distributed_resumes([&] { return strategy.experimental_distribute_dataset(shuffled_batches(), o); },
                                 {0, 1, 3, 4, 7, 8});
    }
  }
}

TEST(DistributedIteratorState, DistributeDatasetsFromFunction) {
  MirroredStrategy strategy(cpus(2));
  for (auto mode : {InputReplicationMode::PER_WORKER, InputReplicationMode::PER_REPLICA}) {
    InputOptions o;
    o.experimental_replication_mode = mode;
    o.experimental_per_replica_buffer_size = 2;
    const auto fn = [](const InputContext& ctx) {
      return data::range(41)
          .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
          .shuffle(5, 3)
          .batch(ctx.get_per_replica_batch_size(4))
          .repeat(2);
    };
    expect_distributed_resumes([&] { return strategy.distribute_datasets_from_function(fn, o); }, {0, 2, 5, 10});
  }
}

TEST(DistributedIteratorState, FourReplicasFromFunction) {
  MirroredStrategy strategy(cpus(4));
  const auto fn = [](const InputContext& ctx) {
    return data::range(30).shuffle(9, 1).batch(ctx.get_per_replica_batch_size(8));
  };
  expect_distributed_resumes([&] { return strategy.distribute_datasets_from_function(fn); }, {0, 1, 2, 4});
}

TEST(DistributedIteratorState, AnotherReplicaCountIsRefusedNamingBoth) {
  MirroredStrategy two(cpus(2)), four(cpus(4));
  auto it = two.experimental_distribute_dataset(shuffled_batches()).begin();
  it.get_next();
  const std::string state = it.save_state();
  auto other = four.experimental_distribute_dataset(shuffled_batches()).begin();
  const std::string msg = message_of<InvalidArgumentError>([&] { other.restore_state(state); });
  EXPECT_THAT(msg, HasSubstr("saved with 2 replicas in sync, restoring into 4"));
  EXPECT_THAT(msg, HasSubstr("saved with 2 local replicas, restoring into 4"));
  // ... and `other` goes on with its own pass.
  EXPECT_EQ(drain_steps(other).size(), 8u);
}

TEST(DistributedIteratorState, CorruptStateIsRefused) {
  MirroredStrategy strategy(cpus(2));
  const auto make = [&] { return strategy.experimental_distribute_dataset(shuffled_batches()); };
  auto it = make().begin();
  it.get_next();
  it.get_next();
  const std::string state = it.save_state();
  const Steps rest = drain_steps(it);
  auto victim = make().begin();
  for (std::size_t n = 0; n < state.size(); n += 7)
    EXPECT_THROW(victim.restore_state(state.substr(0, n)), InvalidArgumentError) << "truncated to " << n;
  EXPECT_THROW(victim.restore_state(state + "x"), InvalidArgumentError);
  // A Dataset iterator's state is not a distributed one.
  auto plain = shuffled_batches().begin();
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { victim.restore_state(plain.save_state()); }),
              HasSubstr("not of a DistributedIterator"));
  victim.restore_state(state);
  EXPECT_EQ(drain_steps(victim), rest);
}

TEST(DistributedIteratorState, AnotherWorkerIsRefused) {
  const auto ds = data::range(48).shuffle(10, 4).batch(8);
  auto as = [&](int workers, int index) {
    return data::detail::distribute_dataset(ds, cpu_devices(2), workers, index, InputOptions{}).begin();
  };
  auto w1of2 = as(2, 1);
  w1of2.get_next();
  const std::string state = w1of2.save_state();
  auto w0of2 = as(2, 0);
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { w0of2.restore_state(state); }),
              HasSubstr("saved as worker 1, restoring as worker 0"));
  auto w0of3 = as(3, 0);
  const std::string msg = message_of<InvalidArgumentError>([&] { w0of3.restore_state(state); });
  EXPECT_THAT(msg, HasSubstr("saved with 2 input workers, restoring into 3"));
  EXPECT_THAT(msg, HasSubstr("saved with 4 replicas in sync, restoring into 6"));
  // The same worker resumes.
  auto again = as(2, 1);
  again.restore_state(state);
  EXPECT_EQ(drain_steps(again), drain_steps(w1of2));
}

TEST(DistributedIteratorState, FileShardedWorkerResumes) {
  TempDir dir;
  const std::vector<std::string> files{dir.write_int64s("f0.bin", {0, 1, 2, 3, 4, 5, 6, 7}),
                                       dir.write_int64s("f1.bin", {8, 9, 10, 11, 12, 13}),
                                       dir.write_int64s("f2.bin", {14, 15, 16, 17})};
  data::Options opts;
  opts.experimental_distribute.auto_shard_policy = data::AutoShardPolicy::FILE;
  const auto make = [&] {
    const auto ds =
        data::fixed_length_record_dataset(files, 8).map(testing::record_to_int64).batch(4).with_options(opts);
    return data::detail::distribute_dataset(ds, cpu_devices(2), 2, 0, InputOptions{});
  };
  expect_distributed_resumes(make, {0, 1, 2, 3});
}

}  // namespace iterstate_test
}  // namespace mirrored
