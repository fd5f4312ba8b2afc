// data::Dataset: sources, transformations, element specs and errors (no distribution).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using data::Dataset;
using data::TensorSpec;
using testing::collect;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Rows;

std::vector<int64_t> flat(const std::vector<Rows>& rows) {
  std::vector<int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(DataDataset, RangeLikePython) {
  EXPECT_EQ(flat(collect(Dataset<>::range(4))), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(flat(collect(data::range(2, 9, 3))), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(flat(collect(data::range(5, 0, -2))), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_TRUE(collect(data::range(0)).empty());
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(0, 5, 0); }), HasSubstr("step"));
  const auto first = *Dataset<>::range(3).begin();
  EXPECT_EQ(first.rank(), 0);
  EXPECT_EQ(Dataset<>::range(3).element_spec(), (TensorSpec{{}, DType::int64}));
}

TEST(DataDataset, EachIterationIsANewPass) {
  auto ds = data::range(3);
  EXPECT_EQ(flat(collect(ds)), flat(collect(ds)));
  auto it = ds.begin();
  EXPECT_EQ(it.next()->item(), 0);
  EXPECT_EQ((*it).item(), 1);
  ++it;
  EXPECT_EQ(it.next()->item(), 2);
  EXPECT_FALSE(it.next().has_value());
  EXPECT_TRUE(it == std::default_sentinel);
  EXPECT_THROW(*it, OutOfRangeError);
}

TEST(DataDataset, FromTensorSlicesOfOneTensor) {
  auto ds = data::from_tensor_slices(Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}));
  static_assert(std::is_same_v<decltype(ds), Dataset<Tensor<float>>>);
  EXPECT_EQ(ds.element_spec(), (TensorSpec{{2}, DType::float32}));
  std::vector<std::vector<float>> rows;
  for (const auto& t : ds) {
    EXPECT_EQ(t.shape(), (Shape{2}));
    rows.push_back(t.to_vector());
  }
  EXPECT_EQ(rows, (std::vector<std::vector<float>>{{1, 2}, {3, 4}, {5, 6}}));
}

TEST(DataDataset, FromTensorSlicesOfFeaturesAndLabels) {
  auto ds = Dataset<>::from_tensor_slices(Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2}), Tensor<int32_t>({7, 8}));
  static_assert(std::is_same_v<decltype(ds), Dataset<std::tuple<Tensor<float>, Tensor<int32_t>>>>);
  auto spec = ds.element_spec();
  EXPECT_EQ(std::get<0>(spec), (TensorSpec{{2}, DType::float32}));
  EXPECT_EQ(std::get<1>(spec), (TensorSpec{{}, DType::int32}));
  std::vector<std::pair<std::vector<float>, int32_t>> seen;
  for (const auto& [x, y] : ds) seen.emplace_back(x.to_vector(), y.item());
  EXPECT_EQ(seen, (std::vector<std::pair<std::vector<float>, int32_t>>{{{1, 2}, 7}, {{3, 4}, 8}}));
}

TEST(DataDataset, FromTensorSlicesErrors) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::from_tensor_slices(Tensor<float>::scalar(1)); }),
              HasSubstr("rank >= 1"));
  EXPECT_THAT(message_of<InvalidArgumentError>([] {
                data::from_tensor_slices(Tensor<float>({1, 2, 3}), Tensor<int64_t>({1, 2}));
              }),
              HasSubstr("same size in the first dimension"));
}

// Regression: a {1<<32, 1<<32} tensor had numel 0 and a 1-byte buffer, and
// from_tensor_slices then copied 16 GiB rows out of it (segfault).
TEST(DataDataset, ShapesThatOverflowAreRejectedNotSliced) {
  constexpr int64_t k32 = int64_t{1} << 32;
  EXPECT_THAT(message_of<InvalidArgumentError>([] {
                for (const auto& row : data::from_tensor_slices(Tensor<float>::zeros({k32, k32}))) (void)row.numel();
              }),
              HasSubstr("(4294967296, 4294967296) is too large"));
  // Huge but representable: 2^59 empty rows (the non-zero dimensions, in bytes, fit in int64).
  auto many = data::from_tensor_slices(Tensor<int64_t>::zeros({int64_t{1} << 59, 0})).take(2);
  EXPECT_EQ(collect(many), (std::vector<Rows>{{}, {}}));
  // A batch whose shape would overflow is an error from the iterator, naming the shape.
  auto wide = data::range(3).map([](const Tensor<int64_t>&) { return Tensor<uint8_t>::zeros({0, int64_t{1} << 62}); });
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                for (const auto& b : wide.batch(4)) (void)b.numel();
              }),
              HasSubstr("shape (3, 0, 4611686018427387904) is too large"));
}

TEST(DataDataset, BatchWithAndWithoutRemainder) {
  auto b = data::range(9).batch(4);
  EXPECT_EQ(collect(b), (std::vector<Rows>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8}}));
  EXPECT_EQ(b.element_spec(), (TensorSpec{{-1}, DType::int64}));
  auto d = data::range(9).batch(4, /*drop_remainder=*/true);
  EXPECT_EQ(collect(d), (std::vector<Rows>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(d.element_spec(), (TensorSpec{{4}, DType::int64}));
  // Batching batches adds a dimension.
  auto bb = data::range(8).batch(2, true).batch(2);
  EXPECT_EQ(bb.element_spec(), (TensorSpec{{-1, 2}, DType::int64}));
  EXPECT_EQ((*bb.begin()).shape(), (Shape{2, 2}));
}

TEST(DataDataset, BatchErrors) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(4).batch(0); }),
              HasSubstr("batch_size must be greater than zero (got 0)"));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(4).batch(-3); }), HasSubstr("(got -3)"));
  auto ragged =
      data::range(1, 4).map([](const Tensor<int64_t>& x) { return Tensor<int64_t>::zeros({x.item()}); }).batch(2);
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { collect(ragged); }),
              HasSubstr("Cannot batch tensors with different shapes in component 0. First element had shape (1,) and "
                        "element 1 had shape (2,)."));
}

TEST(DataDataset, MapChangesTypeAndUnpacksTuples) {
  auto squares = data::range(4).map([](const Tensor<int64_t>& x) { return cast<float>(x * x); });
  static_assert(std::is_same_v<decltype(squares), Dataset<Tensor<float>>>);
  EXPECT_EQ(squares.element_spec(), TensorSpec::unknown_shape(DType::float32));
  std::vector<float> got;
  for (const auto& t : squares) got.push_back(t.item());
  EXPECT_EQ(got, (std::vector<float>{0, 1, 4, 9}));

  auto pairs = data::range(3).map([](const Tensor<int64_t>& x) { return std::make_tuple(x, cast<double>(x) / 2.0); });
  auto sums = pairs.map([](const Tensor<int64_t>& a, const Tensor<double>& b) { return cast<double>(a) + b; });
  std::vector<double> s;
  for (const auto& t : sums) s.push_back(t.item());
  EXPECT_EQ(s, (std::vector<double>{0, 1.5, 3}));
  // A function may also take the whole tuple.
  auto firsts = pairs.map([](const std::tuple<Tensor<int64_t>, Tensor<double>>& e) { return std::get<0>(e); });
  EXPECT_EQ(flat(collect(firsts)), (std::vector<int64_t>{0, 1, 2}));
}

TEST(DataDataset, MutableMapFunctionsGetACopyPerIteration) {
  auto counted = data::range(3).map([n = int64_t{0}](const Tensor<int64_t>& x) mutable { return x + (n++) * 10; });
  EXPECT_EQ(flat(collect(counted)), (std::vector<int64_t>{0, 11, 22}));
  EXPECT_EQ(flat(collect(counted)), (std::vector<int64_t>{0, 11, 22}));
}

struct MapFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(DataDataset, MapExceptionsSurfaceFromTheIteratorWithTheirType) {
  auto ds = data::range(5).map([](const Tensor<int64_t>& x) {
    if (x.item() == 3) throw MapFailure("bad element 3");
    return x;
  });
  std::vector<int64_t> seen;
  auto it = ds.begin();
  EXPECT_THROW(
      {
        while (auto e = it.next()) seen.push_back(e->item());
      },
      MapFailure);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(it.next().has_value());  // the pass is over
  // The same through a prefetch thread.
  std::vector<int64_t> prefetched;
  EXPECT_THROW(
      {
        for (const auto& e : ds.prefetch(2)) prefetched.push_back(e.item());
      },
      MapFailure);
  EXPECT_EQ(prefetched, (std::vector<int64_t>{0, 1, 2}));
}

TEST(DataDataset, FilterTakeSkipRepeat) {
  auto even = data::range(10).filter([](const Tensor<int64_t>& x) { return x.item() % 2 == 0; });
  EXPECT_EQ(flat(collect(even)), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  auto odd = data::range(6).filter([](const Tensor<int64_t>& x) { return Tensor<int64_t>::scalar(x.item() % 2); });
  EXPECT_EQ(flat(collect(odd)), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(flat(collect(data::range(10).take(3))), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(flat(collect(data::range(3).take(-1))), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(flat(collect(data::range(5).skip(3))), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(collect(data::range(5).skip(-1)).empty());
  EXPECT_TRUE(collect(data::range(5).skip(7)).empty());
  EXPECT_EQ(flat(collect(data::range(3).repeat(2))), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(collect(data::range(3).repeat(0)).empty());
  EXPECT_EQ(flat(collect(data::range(2).repeat().take(5))), (std::vector<int64_t>{0, 1, 0, 1, 0}));
  EXPECT_TRUE(collect(data::range(0).repeat()).empty());  // an empty input does not spin forever
  EXPECT_THROW(data::range(3).take(-2), InvalidArgumentError);
  EXPECT_THROW(data::range(3).repeat(-5), InvalidArgumentError);
}

TEST(DataDataset, ShardKeepsEveryNth) {
  EXPECT_EQ(flat(collect(data::range(10).shard(3, 1))), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(flat(collect(data::range(10).shard(1, 0))), iota(10));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(10).shard(2, 2); }),
              HasSubstr("Index must be between 0 and 1 (currently index = 2)"));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(10).shard(2, -1); }),
              HasSubstr("currently index = -1"));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { data::range(10).shard(0, 0); }),
              HasSubstr("Number of shards must be >= 1 (currently num_shards = 0)"));
  // A SHARD_HINT placeholder outside HINT auto-sharding keeps everything.
  EXPECT_EQ(flat(collect(data::range(4).shard(data::SHARD_HINT, data::SHARD_HINT))), iota(4));
}

std::vector<int64_t> one_epoch(const Dataset<Tensor<int64_t>>& ds) { return flat(collect(ds)); }

TEST(DataDataset, ShuffleIsDeterministicForASeedAndReshufflesEachEpoch) {
  auto make = [](uint64_t seed) { return data::range(50).shuffle(50, seed); };
  auto a = make(7), b = make(7);
  const auto a1 = one_epoch(a), a2 = one_epoch(a), a3 = one_epoch(a);
  EXPECT_EQ(a1, one_epoch(b));  // same seed, fresh dataset: same epochs
  EXPECT_EQ(a2, one_epoch(b));
  EXPECT_NE(a1, a2);  // each epoch reshuffled
  EXPECT_NE(a2, a3);
  EXPECT_NE(a1, iota(50));
  EXPECT_NE(a1, one_epoch(make(8)));  // another seed, another order
  for (const auto& epoch : {a1, a2, a3}) {
    auto sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota(50));  // a permutation
  }
  EXPECT_EQ(one_epoch(data::range(20).shuffle(1, 3)), iota(20));  // buffer 1: no shuffling
  // shuffle before repeat reshuffles every repetition.
  const auto twice = one_epoch(data::range(10).shuffle(10, 1).repeat(2));
  EXPECT_NE(std::vector<int64_t>(twice.begin(), twice.begin() + 10),
            std::vector<int64_t>(twice.begin() + 10, twice.end()));
  EXPECT_THROW(data::range(3).shuffle(0, 1), InvalidArgumentError);
}

TEST(DataDataset, SmallShuffleBufferOnlyMovesElementsLocally) {
  const auto e = one_epoch(data::range(100).shuffle(4, 11));
  for (std::size_t i = 0; i < e.size(); ++i) EXPECT_LE(e[i], static_cast<int64_t>(i) + 3) << "position " << i;
}

TEST(DataDataset, PrefetchRunsOnABackgroundThreadAndKeepsOrder) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  auto ds = data::range(20)
                .map([&](const Tensor<int64_t>& x) {
                  std::lock_guard<std::mutex> lock(mu);
                  threads.insert(std::this_thread::get_id());
                  return x;
                })
                .prefetch(3);
  EXPECT_EQ(flat(collect(ds)), iota(20));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(flat(collect(data::range(5).prefetch(0))), iota(5));
  EXPECT_EQ(flat(collect(data::range(5).prefetch(data::AUTOTUNE))), iota(5));
  EXPECT_THROW(data::range(5).prefetch(-2), InvalidArgumentError);
}

TEST(DataDataset, AbandonedPrefetchingIteratorsStopPromptly) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto ds = data::range(3).repeat().prefetch(4).map([](const Tensor<int64_t>& x) { return x * 2; }).prefetch(2);
    auto it = ds.begin();
    EXPECT_EQ(it.next()->item(), 0);
  }  // iterators (and both threads each) destroyed with full queues
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(DataDataset, OptionsAndElementSpec) {
  auto ds = data::range(4);
  EXPECT_EQ(ds.options().experimental_distribute.auto_shard_policy, data::AutoShardPolicy::AUTO);
  data::Options o;
  o.experimental_distribute.auto_shard_policy = data::AutoShardPolicy::OFF;
  auto with = ds.with_options(o).batch(2);
  EXPECT_EQ(with.options().experimental_distribute.auto_shard_policy, data::AutoShardPolicy::OFF);
  EXPECT_EQ(flat(collect(with)), iota(4));
  EXPECT_EQ(repr(with.element_spec()), "TensorSpec(shape=(None,), dtype=int64)");
  EXPECT_EQ(repr(TensorSpec::unknown_shape(DType::uint8)), "TensorSpec(shape=<unknown>, dtype=uint8)");
  EXPECT_EQ(repr(TensorSpec{{3, -1}, DType::float32}), "TensorSpec(shape=(3, None), dtype=float32)");
  EXPECT_EQ(TensorSpec::unknown_shape(DType::uint8).rank(), -1);
}

TEST(DataDataset, StreamsWithoutMaterialisingTheData) {
  // An endless dataset is fine as long as nobody asks for all of it.
  std::atomic<int64_t> made{0};
  auto ds = data::range(0, std::numeric_limits<int64_t>::max())
                .map([&](const Tensor<int64_t>& x) {
                  ++made;
                  return x;
                })
                .batch(4)
                .take(2);
  EXPECT_EQ(collect(ds), (std::vector<Rows>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(made.load(), 8);
}

}  // namespace
}  // namespace mirrored
