// Dropping an iterator whose background thread is in the middle of a long pull (a pipeline that
// never yields) returns at once: the pipeline's loops observe the cancellation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;

constexpr int64_t kEndless = std::numeric_limits<int64_t>::max();
// The issue asks for 100 ms; the bound asserted is generous because the machine is shared and
// loaded. The measured time is printed.
constexpr auto kBound = std::chrono::seconds(1);
// Before the fix a drop never returned: give up waiting after this, failing instead of hanging.
constexpr auto kGiveUp = std::chrono::seconds(20);

bool never(const Tensor<int64_t>&) { return false; }

/// Lets the iterator's background thread get deep into its pull, then destroys the iterator on
/// another thread and returns how long the destruction took, or nullopt when it did not return
/// within kGiveUp (that thread is then left behind: the test has failed).
template <class It>
std::optional<std::chrono::microseconds> time_to_drop(It it, const std::string& what) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto done = std::make_shared<std::promise<std::chrono::microseconds>>();
  std::future<std::chrono::microseconds> took = done->get_future();
  std::thread([it = std::make_shared<It>(std::move(it)), done]() mutable {
    const auto start = std::chrono::steady_clock::now();
    it.reset();
    done->set_value(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start));
  }).detach();
  if (took.wait_for(kGiveUp) != std::future_status::ready) {
    std::cout << "[ timing ] " << what << ": the iterator's destructor did not return within " << kGiveUp.count()
              << " s\n";
    return std::nullopt;
  }
  const auto t = took.get();
  std::cout << "[ timing ] " << what << ": destroyed in " << t.count() / 1000.0 << " ms\n";
  return t;
}

void expect_prompt(const std::optional<std::chrono::microseconds>& t) {
  ASSERT_TRUE(t.has_value()) << "dropping the iterator hung";
  EXPECT_LT(*t, kBound);
}

// Regression: the prefetch thread checked its stop flag only between
// elements, and a filter rejecting everything of an endless repeat never produces one.
TEST(DataCancellation, DroppingAPrefetchIteratorWhosePipelineNeverYieldsReturnsPromptly) {
  auto ds = data::range(10).repeat().filter(never).prefetch(2);
  expect_prompt(time_to_drop(ds.begin(), "prefetch over filter(never) of repeat()"));
}

TEST(DataCancellation, DroppingADistributedIteratorWhosePipelineNeverYieldsReturnsPromptly) {
  MirroredStrategy s(cpus(2));
  auto dd = s.experimental_distribute_dataset(data::range(10).repeat().filter(never).batch(4));
  expect_prompt(time_to_drop(dd.begin(), "distributed filter(never) of repeat()"));
  auto from_fn =
      s.distribute_datasets_from_function([](const InputContext&) { return data::range(5).repeat().filter(never); });
  expect_prompt(time_to_drop(from_fn.begin(), "distribute_datasets_from_function filter(never)"));
}

// A prefetch inside a distributed pipeline: the distributed iterator's thread waits in the inner
// queue, whose own thread loops in the filter. Both let go.
TEST(DataCancellation, NestedPrefetchThreadsAreCancelledThroughTheChain) {
  MirroredStrategy s(cpus(2));
  auto dd = s.experimental_distribute_dataset(data::range(10).repeat().filter(never).prefetch(1).batch(4).prefetch(1));
  expect_prompt(time_to_drop(dd.begin(), "distributed, prefetch within prefetch"));
  auto ds = data::range(10).repeat().filter(never).prefetch(1).map([](const Tensor<int64_t>& x) { return x; });
  expect_prompt(time_to_drop(ds.prefetch(3).begin(), "prefetch within prefetch"));
}

// Loops that pull many elements without a filter: a shuffle buffer or a batch that takes
// forever to fill, a skip or shard that passes over a huge number of elements.
TEST(DataCancellation, LongFillsAndSkipsAreCancelled) {
  expect_prompt(time_to_drop(data::range(0, kEndless).shuffle(int64_t{1} << 40, 7).prefetch(1).begin(),
                             "shuffle buffer of 2^40"));
  expect_prompt(time_to_drop(data::range(0, kEndless).batch(int64_t{1} << 40).prefetch(1).begin(), "batch of 2^40"));
  expect_prompt(time_to_drop(data::range(0, kEndless).skip(kEndless / 2).prefetch(1).begin(), "skip(2^62)"));
  expect_prompt(time_to_drop(
      data::range(0, kEndless).shard(int64_t{1} << 40, (int64_t{1} << 40) - 1).prefetch(1).begin(), "shard(2^40)"));
}

// Cancellation is only for background threads: iterating on the caller's thread, and a prefetch
// that is dropped with items ready, behave as before.
TEST(DataCancellation, IterationIsUnaffected) {
  auto ds = data::range(20).repeat(3).filter([](const Tensor<int64_t>& x) { return x.item() % 2 == 0; });
  EXPECT_EQ(testing::collect(ds.shuffle(4, 3).batch(100)).at(0).size(), 30u);
  EXPECT_EQ(testing::collect(ds.prefetch(2)).size(), 30u);
  MirroredStrategy s(cpus(2));
  auto dd = s.experimental_distribute_dataset(ds.prefetch(1).batch(4));
  int steps = 0;
  for (const auto& step : dd) {
    EXPECT_EQ(step.values().size(), 2u);
    ++steps;
  }
  EXPECT_EQ(steps, 8);  // 30 elements in batches of 4
}

}  // namespace
}  // namespace mirrored
