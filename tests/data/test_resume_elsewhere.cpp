// A pass saved on W input workers x R replicas and resumed on W' x R' (a host lost, a host
// joined): under DATA sharding every element of the pass is taken exactly once over the restart,
// in the global batches of the uninterrupted pass; FILE, HINT and OFF sharding and
// distribute_datasets_from_function are refused naming both placements, and what
// docs/fault_tolerance.md tells a dataset function to do instead is checked to take every element
// once. Workers are simulated in one process through the internal entry points with explicit
// worker counts and indices (as tests/data/test_workers.cpp does).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace resume_elsewhere_test {

using testing::cpu_devices;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Rows;
using Iterator = DistributedIterator<Tensor<int64_t>>;

constexpr int64_t kElements = 103;  // no global batch size below divides it: the last batch is partial
constexpr int64_t kGlobalBatch = 12;

// A fresh pipeline (as a restarted process builds it): two epochs, each shuffled differently.
data::Dataset<Tensor<int64_t>> epochs() {
  return data::range(kElements).shuffle(20, 5).batch(kGlobalBatch).repeat(2).prefetch(2);
}

struct Job {
  std::vector<Iterator> workers;
};
// The iterators of W workers of R replicas each (worker w's replicas are CPU:w*R ..), one pipeline
// per worker as separate processes would build.
Job start(int workers, int replicas, int buffer) {
  Job job;
  InputOptions o;
  o.experimental_per_replica_buffer_size = buffer;
  for (int w = 0; w < workers; ++w)
    job.workers.push_back(
        data::detail::distribute_dataset(epochs(), cpu_devices(replicas, w * replicas), workers, w, o).begin());
  return job;
}
// The next step of every worker put together: the global batch (rows of worker 0's replicas,
// then worker 1's, ...); nullopt when the pass has ended (on every worker at once).
std::optional<Rows> global_step(Job& job) {
  Rows out;
  std::size_t ended = 0;
  for (Iterator& it : job.workers) {
    const auto step = it.get_next_as_optional();
    if (!step) {
      ++ended;
      continue;
    }
    for (const auto& t : step->values()) {
      const Rows rows = t.to_vector();
      out.insert(out.end(), rows.begin(), rows.end());
    }
  }
  EXPECT_TRUE(ended == 0 || ended == job.workers.size()) << ended << " workers ended";
  if (ended) return std::nullopt;
  return out;
}

// The global batches of the uninterrupted pass.
std::vector<Rows> reference() {
  std::vector<Rows> out;
  for (const auto& t : epochs()) out.push_back(t.to_vector());
  return out;
}

TEST(ResumeElsewhere, EveryElementOnceFromAnyWorkerCountToAnyOther) {
  const std::vector<Rows> expected = reference();
  {  // the reference is two epochs of every element once, in global batches of 12 (the last 7)
    std::map<int64_t, int> seen;
    for (const Rows& b : expected)
      for (int64_t id : b) ++seen[id];
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(kElements));
    for (const auto& [id, n] : seen) ASSERT_EQ(n, 2) << "element " << id;
    ASSERT_EQ(expected.size(), 18u);
  }
  std::mt19937 rng(20240611);
  for (int w : {1, 2, 3, 4}) {
    for (int w2 : {1, 2, 3, 4}) {
      // Replicas per worker: 1 or 2 on either side (so N and N' take the values 1 .. 8).
      const int r = 1 + w % 2, r2 = 1 + (w2 + 1) % 2;
      const int buffer = (w + w2) % 3;  // 0: no thread; 1, 2: steps prepared ahead, unevenly
      const std::size_t k = std::uniform_int_distribution<std::size_t>(0, expected.size())(rng);
      SCOPED_TRACE(::testing::Message() << w << "x" << r << " -> " << w2 << "x" << r2 << ", buffer " << buffer
                                        << ", saved after step " << k);
      Job before = start(w, r, buffer);
      std::vector<Rows> got;
      for (std::size_t s = 0; s < k; ++s) got.push_back(global_step(before).value());
      std::vector<std::string> states;
      for (Iterator& it : before.workers) states.push_back(it.save_state());
      for (const Iterator& it : before.workers) EXPECT_EQ(it.steps_taken(), k);

      Job after = start(w2, r2, (buffer + 1) % 3);
      for (Iterator& it : after.workers) {
        it.restore_state(states);
        EXPECT_EQ(it.steps_taken(), k);
      }
      while (auto step = global_step(after)) got.push_back(*step);
      // The global batches of the uninterrupted pass, in order: every element once per epoch.
      EXPECT_EQ(got, expected);
    }
  }
}

TEST(ResumeElsewhere, TheSamePlacementRestoresEachWorkersOwnState) {
  // restore_state(all states) on the saved placement is restore_state(own state): the steps each
  // worker had prepared come back as they were.
  Job before = start(2, 2, 2);
  for (int s = 0; s < 3; ++s) global_step(before);
  std::vector<std::string> states;
  for (Iterator& it : before.workers) states.push_back(it.save_state());
  Job a = start(2, 2, 2), b = start(2, 2, 2);
  for (std::size_t w = 0; w < 2; ++w) {
    a.workers[w].restore_state(states);
    b.workers[w].restore_state(states[w]);
  }
  std::vector<Rows> from_all, from_own;
  while (auto s = global_step(a)) from_all.push_back(*s);
  while (auto s = global_step(b)) from_own.push_back(*s);
  EXPECT_EQ(from_all, from_own);
  EXPECT_EQ(from_all.size(), 15u);
}

TEST(ResumeElsewhere, AnEndedPassStaysEnded) {
  Job before = start(3, 1, 1);
  while (global_step(before)) {
  }
  std::vector<std::string> states;
  for (Iterator& it : before.workers) states.push_back(it.save_state());
  Job after = start(2, 2, 1);
  for (Iterator& it : after.workers) {
    it.restore_state(states);
    EXPECT_FALSE(it.get_next_as_optional().has_value());
  }
}

// The states of `workers` workers (2 replicas each) of `ds` after one step.
template <class Make>
std::vector<std::string> states_after_one_step(Make make, int workers) {
  std::vector<std::string> out;
  for (int w = 0; w < workers; ++w) {
    auto it = make(workers, w).begin();
    it.get_next();
    out.push_back(it.save_state());
  }
  return out;
}

TEST(ResumeElsewhere, FileHintAndOffShardingAreRefusedNamingBothPlacements) {
  testing::TempDir dir;
  const std::vector<std::string> files{dir.write_int64s("a.bin", {0, 1, 2, 3}), dir.write_int64s("b.bin", {4, 5, 6}),
                                       dir.write_int64s("c.bin", {7, 8, 9, 10, 11}),
                                       dir.write_int64s("d.bin", {12, 13})};
  const auto with = [&](data::AutoShardPolicy policy) {
    data::Options opts;
    opts.experimental_distribute.auto_shard_policy = policy;
    return [opts, files](int workers, int w) {
      const auto ds = data::fixed_length_record_dataset(files, 8)
                          .map(testing::record_to_int64)
                          .shard(data::SHARD_HINT, data::SHARD_HINT)
                          .batch(4)
                          .with_options(opts);
      return data::detail::distribute_dataset(ds, cpu_devices(2), workers, w, InputOptions{});
    };
  };
  struct Case {
    data::AutoShardPolicy policy;
    const char* why;
  };
  for (const Case& c :
       {Case{data::AutoShardPolicy::FILE, "FILE-sharded"}, Case{data::AutoShardPolicy::HINT, "HINT-sharded"},
        Case{data::AutoShardPolicy::OFF, "auto-shard policy is OFF"}}) {
    const auto make = with(c.policy);
    const std::vector<std::string> states = states_after_one_step(make, 2);
    auto three = make(3, 0).begin();
    const std::string msg = message_of<InvalidArgumentError>([&] { three.restore_state(states); });
    EXPECT_THAT(msg, HasSubstr("saved on 2 workers x 2 replicas, restoring on 3 workers x 2 replicas"));
    EXPECT_THAT(msg, HasSubstr(c.why));
    // One worker reads everything under any policy, so it is DATA-like, but the saved pass was
    // not: its pipeline description differs.
    auto one = make(1, 0).begin();
    EXPECT_THAT(message_of<InvalidArgumentError>([&] { one.restore_state(states); }),
                HasSubstr("DATA-sharded on both sides"));
    // The refused iterator goes on with its own pass.
    EXPECT_TRUE(three.get_next_as_optional().has_value());
  }
}

TEST(ResumeElsewhere, DatasetsFromAFunctionAreRefused) {
  const auto make = [](int workers, int w) {
    const auto fn = [](const InputContext& ctx) {
      return data::range(40).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2);
    };
    return data::detail::distribute_datasets_from_function(fn, cpu_devices(2), workers, w, InputOptions{});
  };
  const std::vector<std::string> states = states_after_one_step(make, 2);
  auto one = make(1, 0).begin();
  const std::string msg = message_of<InvalidArgumentError>([&] { one.restore_state(states); });
  EXPECT_THAT(msg, HasSubstr("saved on 2 workers x 2 replicas, restoring on 1 worker x 2 replicas"));
  EXPECT_THAT(msg, HasSubstr("distribute_datasets_from_function"));
}

TEST(ResumeElsewhere, StatesOfOnePassAtOneStepAreRequired) {
  Job job = start(2, 1, 0);
  global_step(job);
  const std::string w0 = job.workers[0].save_state(), w1 = job.workers[1].save_state();
  job.workers[0].get_next();
  const std::string w0_later = job.workers[0].save_state();
  auto target = start(3, 1, 0);
  Iterator& it = target.workers[0];
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                it.restore_state(std::vector<std::string>{w0_later, w1});
              }),
              HasSubstr("worker 0 after 2 steps, worker 1 after 1 steps"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                it.restore_state(std::vector<std::string>{w1, w0});
              }),
              HasSubstr("saved state 0 is worker 1's"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { it.restore_state(std::vector<std::string>{w0}); }),
              HasSubstr("1 saved worker states for a pass saved by 2 workers"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { it.restore_state(std::vector<std::string>{}); }),
              HasSubstr("no saved worker state"));
  // Corrupt bytes: an error, never a read past the end.
  for (std::size_t n = 0; n < w1.size(); n += 11)
    EXPECT_THROW(it.restore_state(std::vector<std::string>{w0, w1.substr(0, n)}), InvalidArgumentError) << n;
  it.restore_state(std::vector<std::string>{w0, w1});
  EXPECT_EQ(it.steps_taken(), 1u);
}

// What docs/fault_tolerance.md tells a dataset function to do on another placement: shard the
// source before batching, and skip the elements the saved steps consumed (steps x global batch)
// before the shard. Every element is then taken once.
TEST(ResumeElsewhere, ADatasetFunctionThatSkipsTheConsumedElementsTakesEachOnce) {
  constexpr int64_t kN = 90, kG = 6;
  std::mt19937 rng(7);
  for (int w : {1, 2, 3}) {
    for (int w2 : {1, 2, 3}) {
      const int r = 3 - w % 2, r2 = 3 - w2 % 2;  // 2 or 3 replicas: G = 6 divides among any N
      const auto make = [](int workers, int index, int replicas, int64_t consumed) {
        const auto fn = [consumed](const InputContext& ctx) {
          return data::range(kN)
              .shuffle(kN, 3)
              .skip(consumed)
              .shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
              .batch(ctx.get_per_replica_batch_size(kG));
        };
        return data::detail::distribute_datasets_from_function(fn, cpu_devices(replicas), workers, index,
                                                               InputOptions{});
      };
      const int64_t k = std::uniform_int_distribution<int64_t>(0, kN / kG)(rng);
      SCOPED_TRACE(::testing::Message() << w << "x" << r << " -> " << w2 << "x" << r2 << " after step " << k);
      std::map<int64_t, int> seen;
      const auto take = [&](int workers, int replicas, int64_t consumed, int64_t steps) {
        for (int i = 0; i < workers; ++i) {
          auto it = make(workers, i, replicas, consumed).begin();
          for (int64_t s = 0; s < steps; ++s) {
            const auto step = it.get_next_as_optional();
            if (!step) break;
            for (const auto& t : step->values())
              for (int64_t id : t.to_vector()) ++seen[id];
          }
        }
      };
      take(w, r, 0, k);
      take(w2, r2, k * kG, kN);
      ASSERT_EQ(seen.size(), static_cast<std::size_t>(kN));
      for (const auto& [id, n] : seen) EXPECT_EQ(n, 1) << "element " << id;
    }
  }
}

}  // namespace resume_elsewhere_test
}  // namespace mirrored
