// Auto-sharding across input workers, simulated in one process by passing the worker count and
// index to the internal entry point (a multi-worker strategy will pass its own).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using data::AutoShardPolicy;
using testing::collect_steps;
using testing::cpu_devices;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Steps;
using testing::TempDir;

// Two record files holding 0..5 and 6..11.
class DataWorkers : public ::testing::Test {
 protected:
  TempDir dir;
  std::vector<std::string> files{dir.write_int64s("w0.bin", {0, 1, 2, 3, 4, 5}),
                                 dir.write_int64s("w1.bin", {6, 7, 8, 9, 10, 11})};

  data::Dataset<Tensor<int64_t>> from_files(AutoShardPolicy policy, std::vector<std::string> names = {}) const {
    data::Options o;
    o.experimental_distribute.auto_shard_policy = policy;
    return data::fixed_length_record_dataset(names.empty() ? files : names, 8)
        .map(testing::record_to_int64)
        .batch(4)
        .with_options(o);
  }
  // What worker `w` of `workers` (2 replicas each) feeds its replicas. Each worker builds its own
  // pipeline, as a separate process would.
  Steps worker(const data::Dataset<Tensor<int64_t>>& ds, int workers, int w) const {
    return collect_steps(data::detail::distribute_dataset(ds, cpu_devices(2), workers, w, InputOptions{}));
  }
  static std::vector<int64_t> all_values(const std::vector<Steps>& workers) {
    std::vector<int64_t> out;
    for (const auto& steps : workers)
      for (const auto& step : steps)
        for (const auto& rows : step) out.insert(out.end(), rows.begin(), rows.end());
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::vector<int64_t> zero_to(int64_t n) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(i);
    return v;
  }
};

TEST_F(DataWorkers, DataShardingKeepsEachWorkersSlicesOfEveryGlobalBatch) {
  const auto ds = from_files(AutoShardPolicy::DATA);
  const Steps w0 = worker(ds, 2, 0), w1 = worker(ds, 2, 1);
  EXPECT_EQ(w0, (Steps{{{0}, {1}}, {{4}, {5}}, {{8}, {9}}}));
  EXPECT_EQ(w1, (Steps{{{2}, {3}}, {{6}, {7}}, {{10}, {11}}}));
  EXPECT_EQ(all_values({w0, w1}), zero_to(12));
}

TEST_F(DataWorkers, DataShardingOfAPartialBatchGivesTrailingWorkersEmptyBatches) {
  const auto ds = data::range(10).batch(4);  // AUTO without files = DATA
  EXPECT_EQ(worker(ds, 2, 0), (Steps{{{0}, {1}}, {{4}, {5}}, {{8}, {9}}}));
  EXPECT_EQ(worker(ds, 2, 1), (Steps{{{2}, {3}}, {{6}, {7}}, {{}, {}}}));
}

TEST_F(DataWorkers, FileShardingSplitsTheFileList) {
  for (AutoShardPolicy policy : {AutoShardPolicy::FILE, AutoShardPolicy::AUTO}) {
    const auto ds = from_files(policy);
    const Steps w0 = worker(ds, 2, 0), w1 = worker(ds, 2, 1);
    // Worker 0 reads w0.bin only: batches [0..3] and [4, 5], each cut into 4 slices, 2 per step.
    EXPECT_EQ(w0, (Steps{{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{}, {}}}));
    EXPECT_EQ(w1, (Steps{{{6}, {7}}, {{8}, {9}}, {{10}, {11}}, {{}, {}}}));
    EXPECT_EQ(all_values({w0, w1}), zero_to(12));
  }
}

TEST_F(DataWorkers, FileShardingErrors) {
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { worker(from_files(AutoShardPolicy::FILE, {files[0]}), 2, 0); }),
              HasSubstr("reads 1 files, fewer than the 2 input workers"));
  data::Options o;
  o.experimental_distribute.auto_shard_policy = AutoShardPolicy::FILE;
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { worker(data::range(8).batch(4).with_options(o), 2, 1); }),
              HasSubstr("reads no files"));
  // AUTO with too few files falls back to DATA.
  EXPECT_EQ(worker(from_files(AutoShardPolicy::AUTO, {files[1]}), 2, 1), (Steps{{{8}, {9}}, {{}, {}}}));
  // One worker: nothing to shard, no error.
  EXPECT_EQ(worker(data::range(4).batch(4).with_options(o), 1, 0), (Steps{{{0, 1}, {2, 3}}}));
}

TEST_F(DataWorkers, OffReadsEverythingOnEveryWorker) {
  const auto ds = from_files(AutoShardPolicy::OFF);
  const Steps expected{{{0}, {1}}, {{2}, {3}}, {{4}, {5}}, {{6}, {7}}, {{8}, {9}}, {{10}, {11}}};
  EXPECT_EQ(worker(ds, 2, 0), expected);
  EXPECT_EQ(worker(ds, 2, 1), expected);
}

TEST_F(DataWorkers, HintReplacesShardPlaceholders) {
  data::Options o;
  o.experimental_distribute.auto_shard_policy = AutoShardPolicy::HINT;
  const auto ds = data::range(12).shard(data::SHARD_HINT, data::SHARD_HINT).batch(4).with_options(o);
  EXPECT_EQ(worker(ds, 2, 0), (Steps{{{0}, {2}}, {{4}, {6}}, {{8}, {10}}, {{}, {}}}));
  EXPECT_EQ(worker(ds, 2, 1), (Steps{{{1}, {3}}, {{5}, {7}}, {{9}, {11}}, {{}, {}}}));
}

TEST_F(DataWorkers, WorkerIndexOutOfRange) {
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { worker(data::range(4).batch(2), 2, 2); }),
              HasSubstr("worker_index 2 out of range for 2 workers"));
  EXPECT_THROW(worker(data::range(4).batch(2), 0, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace mirrored
