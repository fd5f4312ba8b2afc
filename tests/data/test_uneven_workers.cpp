// Uneven input across workers (TF's rule for several workers): the distributed iterators of
// simulated workers (threads of this process, each with its own pipeline as a worker process
// would have) agree step by step through a stand-in for the strategy's cross-worker exchange, so
// a worker whose input has ended gets empty batches until every worker's has. The real exchange
// across worker processes is tested by tests/cluster (scenario "uneven").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace uneven_test {

using data::AutoShardPolicy;
using testing::cpu_devices;
using testing::cpus;
using testing::Rows;
using testing::Steps;
using testing::TempDir;

// The workers' exchange between threads: each call waits until every worker has answered and
// returns how many answered true. Counts the calls.
class Exchange {
 public:
  explicit Exchange(int workers) : workers_(workers) {}

  int count(bool mine) {
    std::unique_lock lock(mu_);
    ++calls_;
    const uint64_t round = round_;
    sum_ += mine ? 1 : 0;
    if (++arrived_ == workers_) {
      result_ = sum_;
      sum_ = arrived_ = 0;
      ++round_;
      cv_.notify_all();
      return result_;
    }
    // A worker answers the next round only after this one is complete, so result_ stays this round's.
    MIRRORED_ENFORCE(cv_.wait_for(lock, std::chrono::seconds(60), [&] { return round_ != round; }),
                     DeadlineExceededError, "uneven_test::Exchange: a worker did not answer");
    return result_;
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  data::detail::InputAgreement agreement() {
    return {[this](bool mine) { return count(mine); }, [](const std::exception_ptr&) {}};
  }

 private:
  int workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, sum_ = 0, result_ = 0, calls_ = 0;
  uint64_t round_ = 0;
};

// What one step gave each replica: values and shape.
struct Got {
  Rows values;
  Shape shape;
  friend bool operator==(const Got&, const Got&) = default;
};
using WorkerSteps = std::vector<std::vector<Got>>;  // [step][replica]

template <class E>
WorkerSteps take_all(const DistributedDataset<E>& dd) {
  WorkerSteps out;
  for (const PerReplica<E>& step : dd) {
    std::vector<Got> replicas;
    for (const auto& t : step.values()) replicas.push_back({t.to_vector(), t.shape()});
    out.push_back(replicas);
  }
  return out;
}

// Runs `make(w, agreement)` and a whole pass on W threads; returns each worker's steps.
template <class Make>
std::vector<WorkerSteps> run_workers(int workers, Make make, Exchange& exchange) {
  std::vector<WorkerSteps> runs(static_cast<std::size_t>(workers));
  std::vector<std::string> errors(static_cast<std::size_t>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        runs[static_cast<std::size_t>(w)] = take_all(make(w, exchange.agreement()));
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < workers; ++w) EXPECT_EQ(errors[static_cast<std::size_t>(w)], "") << "worker " << w;
  return runs;
}

int64_t element_count(const std::vector<WorkerSteps>& runs) {
  int64_t n = 0;
  for (const WorkerSteps& run : runs)
    for (const auto& step : run)
      for (const Got& g : step) n += static_cast<int64_t>(g.values.size());
  return n;
}

// Rows of 3 columns: row i holds 3i, 3i+1, 3i+2; batched by `batch`.
data::Dataset<Tensor<int64_t>> rows_of_three(int64_t first_row, int64_t rows, int64_t batch) {
  std::vector<int64_t> v;
  for (int64_t i = first_row; i < first_row + rows; ++i)
    for (int64_t c = 0; c < 3; ++c) v.push_back(3 * i + c);
  return data::from_tensor_slices(Tensor<int64_t>::from_vector(v, {rows, 3})).batch(batch);
}

TEST(UnevenWorkers, FromFunctionWorkersWithThreeAndTwoBatchesBothRunThreeSteps) {
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas per worker");
    Exchange exchange(2);
    // Worker 0: 3 * replicas batches of 2 rows; worker 1: 2 * replicas.
    const auto runs = run_workers(
        2,
        [&](int w, data::detail::InputAgreement a) {
          auto fn = [&](const InputContext&) { return rows_of_three(100 * w, (3 - w) * 2 * replicas, 2); };
          return data::detail::distribute_datasets_from_function(fn, cpu_devices(replicas), 2, w, InputOptions{},
                                                                 std::move(a));
        },
        exchange);
    ASSERT_EQ(runs[0].size(), 3u);
    ASSERT_EQ(runs[1].size(), 3u);
    for (int r = 0; r < replicas; ++r) {
      EXPECT_EQ(runs[1][2][static_cast<std::size_t>(r)], (Got{{}, {0, 3}})) << "replica " << r;
      EXPECT_EQ(runs[0][2][static_cast<std::size_t>(r)].shape, (Shape{2, 3}));
    }
    EXPECT_EQ(element_count(runs), 3 * 10 * replicas);  // 3 values in each of the 10R rows of both workers
    EXPECT_EQ(exchange.calls(), 2 * 4);                 // 3 steps and the end, on each worker
  }
}

TEST(UnevenWorkers, AWorkerWithNoDataAtAllGetsEmptyBatchesShapedByTheSpec) {
  Exchange exchange(3);
  const auto runs = run_workers(
      3,
      [](int w, data::detail::InputAgreement a) {
        auto fn = [w](const InputContext&) { return rows_of_three(0, w == 1 ? 0 : 2 * (w + 1), 2); };
        return data::detail::distribute_datasets_from_function(fn, cpu_devices(2), 3, w, InputOptions{}, std::move(a));
      },
      exchange);
  // 2, 0 and 6 rows in batches of 2 over 2 replicas: 1, 0 and 2 steps' worth; every worker runs 2.
  for (int w = 0; w < 3; ++w) ASSERT_EQ(runs[static_cast<std::size_t>(w)].size(), 2u) << "worker " << w;
  for (const auto& step : runs[1])
    for (const Got& g : step) EXPECT_EQ(g, (Got{{}, {0, 3}}));
  EXPECT_EQ(runs[0][0][0], (Got{{0, 1, 2, 3, 4, 5}, {2, 3}}));
  EXPECT_EQ(runs[0][0][1], (Got{{}, {0, 3}}));  // the worker's own partial step, as before
  EXPECT_EQ(runs[0][1][0], (Got{{}, {0, 3}}));
  EXPECT_EQ(element_count(runs), 3 * (2 + 0 + 6));
}

// Record files of int64 values, batched by 4 (FILE sharding: worker w of W reads the files i with
// i % W == w).
class UnevenFiles : public ::testing::Test {
 protected:
  TempDir dir;
  data::Dataset<Tensor<int64_t>> files(const std::vector<std::vector<int64_t>>& contents, AutoShardPolicy policy) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < contents.size(); ++i)
      names.push_back(dir.write_int64s("f" + std::to_string(i) + ".bin", contents[i]));
    data::Options o;
    o.experimental_distribute.auto_shard_policy = policy;
    return data::fixed_length_record_dataset(names, 8).map(testing::record_to_int64).batch(4).with_options(o);
  }
};

TEST_F(UnevenFiles, FileShardingWithUnequalFilesEndsTogether) {
  // Worker 0 reads 6 records (batches of 4 and 2), worker 1 one record, worker 2 none (an empty file).
  const auto ds = files({{0, 1, 2, 3, 4, 5}, {6}, {}}, AutoShardPolicy::FILE);
  Exchange exchange(3);
  const auto runs = run_workers(
      3,
      [&](int w, data::detail::InputAgreement a) {
        return data::detail::distribute_dataset(ds, cpu_devices(1), 3, w, InputOptions{}, std::move(a));
      },
      exchange);
  // Each of a worker's batches is cut into 3 slices (one per replica in sync), one per step.
  for (int w = 0; w < 3; ++w) ASSERT_EQ(runs[static_cast<std::size_t>(w)].size(), 6u) << "worker " << w;
  EXPECT_EQ(runs[0][0][0], (Got{{0, 1}, {2}}));
  EXPECT_EQ(runs[0][5][0], (Got{{}, {0}}));  // the last slice of the partial batch [4, 5]
  EXPECT_EQ(runs[1][0][0], (Got{{6}, {1}}));
  for (std::size_t k = 3; k < 6; ++k) EXPECT_EQ(runs[1][k][0], (Got{{}, {0}})) << "step " << k;
  for (const auto& step : runs[2]) EXPECT_EQ(step[0], (Got{{}, {0}}));
  EXPECT_EQ(element_count(runs), 7);
  EXPECT_EQ(exchange.calls(), 3 * 7);
}

TEST_F(UnevenFiles, DataShardingIsEvenAndEndsTogether) {
  const auto ds = files({{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}}, AutoShardPolicy::DATA);
  Exchange exchange(2);
  const auto runs = run_workers(
      2,
      [&](int w, data::detail::InputAgreement a) {
        return data::detail::distribute_dataset(ds, cpu_devices(2), 2, w, InputOptions{}, std::move(a));
      },
      exchange);
  // Global batches of 4, 4 and 2 rows: every worker keeps its 2 slices of each.
  ASSERT_EQ(runs[0].size(), 3u);
  ASSERT_EQ(runs[1].size(), 3u);
  EXPECT_EQ(runs[1][2][0], (Got{{}, {0}}));
  EXPECT_EQ(runs[1][2][1], (Got{{}, {0}}));
  EXPECT_EQ(element_count(runs), 10);
}

TEST(UnevenWorkers, UnbatchedElementsEndWhenTheFirstWorkerEnds) {
  Exchange exchange(2);
  const auto runs = run_workers(
      2,
      [](int w, data::detail::InputAgreement a) {
        auto fn = [w](const InputContext&) { return data::range(w == 0 ? 5 : 2); };
        return data::detail::distribute_datasets_from_function(fn, cpu_devices(1), 2, w, InputOptions{}, std::move(a));
      },
      exchange);
  // Rank 0: no empty batch can stand in, so both end after 2 steps (worker 0's third is dropped).
  ASSERT_EQ(runs[0].size(), 2u);
  ASSERT_EQ(runs[1].size(), 2u);
  EXPECT_EQ(runs[0][1][0], (Got{{1}, {}}));
}

TEST(UnevenWorkers, SavedStatesKeepTheWorkersInStep) {
  Exchange exchange(2);
  auto make = [](int w, data::detail::InputAgreement a) {
    auto fn = [w](const InputContext&) { return data::range(w == 0 ? 6 : 2).batch(2); };
    return data::detail::distribute_datasets_from_function(fn, cpu_devices(1), 2, w, InputOptions{}, std::move(a));
  };
  // Worker 0 has 3 steps, worker 1 one. After 2 steps worker 1 has ended locally (it pads); the
  // restored iterators go on padding and end together. After the end, restored ones stay ended
  // without another exchange.
  std::vector<std::string> mid(2), end(2);
  std::vector<WorkerSteps> rest(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      auto dd = make(w, exchange.agreement());
      auto it = dd.begin();
      it.get_next();
      it.get_next();
      mid[static_cast<std::size_t>(w)] = it.save_state();
      while (it.get_next_as_optional()) {
      }
      end[static_cast<std::size_t>(w)] = it.save_state();
      auto again = make(w, exchange.agreement()).begin();
      again.restore_state(mid[static_cast<std::size_t>(w)]);
      while (auto step = again.get_next_as_optional())
        rest[static_cast<std::size_t>(w)].push_back({{step->values()[0].to_vector(), step->values()[0].shape()}});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(rest[0], (WorkerSteps{{Got{{4, 5}, {2}}}}));
  EXPECT_EQ(rest[1], (WorkerSteps{{Got{{}, {0}}}}));
  const int before = exchange.calls();
  auto dd = make(1, exchange.agreement());
  auto it = dd.begin();
  it.restore_state(end[1]);
  EXPECT_FALSE(it.get_next_as_optional().has_value());
  EXPECT_EQ(exchange.calls(), before);  // no exchange: the end was agreed before the save
}

TEST(UnevenWorkers, OneWorkerHasNoAgreement) {
  MirroredStrategy strategy(cpus(2));
  EXPECT_FALSE(detail::input_agreement(strategy));  // so no exchange is made per step
}

}  // namespace uneven_test
}  // namespace mirrored
