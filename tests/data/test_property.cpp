// No data lost or duplicated: over an epoch of any data set, any replica count, both split rules
// and 1-3 input workers, the multiset of elements the replicas see equals the data set.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::collect_steps;
using testing::cpu_devices;
using testing::Rows;
using testing::Steps;

struct Config {
  int64_t n, batch;
  bool drop, shuffled;
  int replicas, workers;
  RebatchPolicy policy;
  uint64_t seed;

  std::string describe() const {
    std::ostringstream os;
    os << "n=" << n << " batch=" << batch << " drop=" << drop << " shuffled=" << shuffled << " replicas=" << replicas
       << " workers=" << workers << " policy=" << (policy == RebatchPolicy::CEIL ? "CEIL" : "BALANCED");
    return os.str();
  }
  data::Dataset<Tensor<int64_t>> dataset() const {
    auto ds = data::range(n);
    if (shuffled) ds = ds.shuffle(16, seed);
    return ds.batch(batch, drop);
  }
};

Config random_config(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Config c;
  c.n = pick(0, 90);
  c.batch = pick(1, 13);
  c.drop = pick(0, 3) == 0;
  c.shuffled = pick(0, 1) == 1;
  c.replicas = static_cast<int>(pick(1, 5));
  c.workers = static_cast<int>(pick(1, 3));
  c.policy = pick(0, 1) ? RebatchPolicy::CEIL : RebatchPolicy::BALANCED;
  c.seed = rng();
  return c;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The elements of one epoch of the global batches (what the replicas together must see).
std::vector<int64_t> expected_elements(const Config& c) {
  std::vector<int64_t> out;
  for (const auto& b : c.dataset()) {
    const auto v = b.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return sorted(out);
}

TEST(DataProperty, NoElementLostOrDuplicated) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 150; ++trial) {
    const Config c = random_config(rng);
    std::vector<int64_t> seen;
    std::vector<std::size_t> steps_per_worker;
    for (int w = 0; w < c.workers; ++w) {
      // Each worker builds its own pipeline (a process of its own), DATA sharding (no files).
      auto dist = data::detail::distribute_dataset(c.dataset(), cpu_devices(c.replicas), c.workers, w,
                                                   InputOptions{true, InputReplicationMode::PER_WORKER, 1, c.policy});
      const Steps steps = collect_steps(dist);
      steps_per_worker.push_back(steps.size());
      for (const auto& step : steps) {
        ASSERT_EQ(step.size(), static_cast<std::size_t>(c.replicas)) << c.describe();
        for (const Rows& rows : step) seen.insert(seen.end(), rows.begin(), rows.end());
      }
    }
    EXPECT_EQ(sorted(seen), expected_elements(c)) << c.describe();
    EXPECT_TRUE(std::all_of(steps_per_worker.begin(), steps_per_worker.end(),
                            [&](std::size_t s) { return s == steps_per_worker[0]; }))
        << "workers disagree on the number of steps: " << c.describe();
  }
}

TEST(DataProperty, OneWorkerKeepsTheOrderWithinEachGlobalBatch) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    Config c = random_config(rng);
    c.workers = 1;
    std::vector<Rows> global;
    for (const auto& b : c.dataset()) global.push_back(b.to_vector());
    MirroredStrategy strategy(testing::cpus(c.replicas));
    InputOptions o;
    o.rebatch_policy = c.policy;
    const Steps steps = collect_steps(strategy.experimental_distribute_dataset(c.dataset(), o));
    ASSERT_EQ(steps.size(), global.size()) << c.describe();
    for (std::size_t k = 0; k < steps.size(); ++k) {
      Rows joined;
      for (const Rows& rows : steps[k]) joined.insert(joined.end(), rows.begin(), rows.end());
      EXPECT_EQ(joined, global[k]) << c.describe() << " step " << k;
    }
  }
}

// BALANCED cuts every global batch, full or partial, into slices whose sizes differ by at most
// one, the larger ones first (docs/api.md §9), across all workers' replicas in global order.
TEST(DataProperty, BalancedSlicesOfEveryBatchDifferByAtMostOne) {
  std::mt19937_64 rng(1913);
  for (int trial = 0; trial < 100; ++trial) {
    Config c = random_config(rng);
    c.policy = RebatchPolicy::BALANCED;
    std::vector<Steps> per_worker;
    for (int w = 0; w < c.workers; ++w) {
      per_worker.push_back(collect_steps(
          data::detail::distribute_dataset(c.dataset(), cpu_devices(c.replicas), c.workers, w,
                                           InputOptions{true, InputReplicationMode::PER_WORKER, 1, c.policy})));
    }
    std::vector<Rows> global;
    for (const auto& b : c.dataset()) global.push_back(b.to_vector());
    ASSERT_EQ(per_worker[0].size(), global.size()) << c.describe();
    const int64_t n = static_cast<int64_t>(c.replicas) * c.workers;
    for (std::size_t k = 0; k < global.size(); ++k) {
      const int64_t b = static_cast<int64_t>(global[k].size());
      std::vector<int64_t> sizes, want;
      for (const Steps& steps : per_worker)
        for (const Rows& rows : steps[k]) sizes.push_back(static_cast<int64_t>(rows.size()));
      for (int64_t r = 0; r < n; ++r) want.push_back(b / n + (r < b % n ? 1 : 0));
      EXPECT_EQ(sizes, want) << c.describe() << " step " << k;
    }
  }
}

TEST(DataProperty, DealtElementsAreNeitherLostNorDuplicated) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 60; ++trial) {
    const Config c = random_config(rng);
    auto fn = [&](const InputContext&) { return c.dataset(); };
    auto dist = data::detail::distribute_datasets_from_function(fn, cpu_devices(c.replicas), 1, 0, InputOptions{});
    std::vector<int64_t> seen;
    for (const auto& step : collect_steps(dist))
      for (const Rows& rows : step) seen.insert(seen.end(), rows.begin(), rows.end());
    EXPECT_EQ(sorted(seen), expected_elements(c)) << c.describe();
  }
}

}  // namespace
}  // namespace mirrored
