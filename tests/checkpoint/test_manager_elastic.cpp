// A checkpoint saved with N replicas restores into N' (a host lost or joined; MirroredStrategy
// with N' CPU replicas stands in for W' workers x R' replicas): the optimizer's slots, sharded or
// not on either side, and its step counter are the saved values exactly (each slot's whole value
// is the file's, and a sharded slot's slices put together are it); a tracked input iterator goes
// on with the next global batch of the saved pass; one that cannot resume elsewhere is refused
// naming the file, the iterator and both placements, and nothing changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manager_test_util.hpp"

namespace mirrored {
namespace manager_elastic_test {

using namespace manager_testing;  // NOLINT: the manager test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;

void expect_restores_elsewhere(const std::string& dir, Opt kind, int n, bool sharded, int n2, bool sharded2) {
  SCOPED_TRACE(::testing::Message() << opt_name(kind) << ": " << n << (sharded ? " sharded" : " plain") << " -> " << n2
                                    << (sharded2 ? " sharded" : " plain"));
  std::filesystem::remove_all(dir);
  Model a(n, kind, sharded);
  checkpoint::CheckpointManager ma(a.strategy, dir);
  a.track(ma);
  a.train(0, 3);
  const std::string path = ma.save(3);
  const State saved = state_of(a, /*whole_slots=*/true);

  Model b(n2, kind, sharded2, /*init_seed=*/5);
  b.train(0, 1);  // slots and a step counter of its own, overwritten
  checkpoint::CheckpointManager mb(b.strategy, dir);
  b.track(mb);
  ASSERT_EQ(mb.restore_or_initialize(), 3);
  EXPECT_TRUE(state_of(b, /*whole_slots=*/true) == saved);
  // Every replica's copy of the step counter.
  EXPECT_EQ(state_of(b).iterations, std::vector<int64_t>(static_cast<std::size_t>(n2), 3));
  // Each slot is the file's value; a sharded one keeps a slice per replica, which put together
  // in replica order are that value.
  const checkpoint::Checkpoint file = checkpoint::load(path);
  for (std::size_t k = 0; k < b.vars.size(); ++k) {
    for (const auto& slot_name : opt_slots(kind)) {
      const Variable<float> slot = b.opt->get_slot(b.vars[k], slot_name);
      const std::vector<uint32_t> whole = bits(file.get<float>("optimizer/" + kNames[k] + "/" + slot_name));
      EXPECT_EQ(bits(slot.value()), whole) << kNames[k] << "/" << slot_name;
      EXPECT_EQ(slot.is_sharded(), sharded2);
      if (sharded2) {
        EXPECT_EQ(all_copies(slot), whole) << kNames[k] << "/" << slot_name;
        EXPECT_EQ(slot.components().size(), static_cast<std::size_t>(n2));
      }
    }
  }
}

TEST_F(ManagerTest, AdamStateRestoresFromAnyReplicaCountToAnyOtherShardedOrNot) {
  for (int n : {1, 2, 3, 4})
    for (int n2 : {1, 2, 3, 4})
      for (bool sharded : {false, true})
        for (bool sharded2 : {false, true}) expect_restores_elsewhere(dir_, Opt::adam, n, sharded, n2, sharded2);
}

TEST_F(ManagerTest, OtherOptimizersRestoreElsewhereToo) {
  for (Opt kind : {Opt::momentum, Opt::rmsprop_centered_momentum, Opt::adagrad}) {
    expect_restores_elsewhere(dir_, kind, 3, true, 2, false);
    expect_restores_elsewhere(dir_, kind, 1, false, 4, true);
  }
}

// The rows of every replica of each step, in replica order: the global batch.
std::vector<std::vector<int64_t>> global_batches(DistributedIterator<Tensor<int64_t>>& it, std::size_t steps) {
  std::vector<std::vector<int64_t>> out;
  for (std::size_t s = 0; s < steps; ++s) {
    const auto step = it.get_next_as_optional();
    if (!step) break;
    std::vector<int64_t> rows;
    for (const auto& t : step->values()) {
      const auto v = t.to_vector();
      rows.insert(rows.end(), v.begin(), v.end());
    }
    out.push_back(rows);
  }
  return out;
}

TEST_F(ManagerTest, AnInputIteratorResumesOnAnotherReplicaCount) {
  const auto dataset = [] { return data::range(50).shuffle(50, 9).batch(8).prefetch(1); };
  std::vector<std::vector<int64_t>> expected;
  for (const auto& t : dataset()) expected.push_back(t.to_vector());
  ASSERT_EQ(expected.size(), 7u);
  for (int n : {1, 2, 3}) {
    for (int n2 : {1, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << n << " -> " << n2 << " replicas");
      std::filesystem::remove_all(dir_);
      Model a(n, Opt::adam, true);
      auto input = a.strategy.experimental_distribute_dataset(dataset()).begin();
      checkpoint::CheckpointManager ma(a.strategy, dir_);
      a.track(ma);
      ma.track("input", input);
      std::vector<std::vector<int64_t>> got = global_batches(input, 3);
      a.train(0, 3);
      ma.save(3);

      Model b(n2, Opt::adam, false, 5);
      auto resumed = b.strategy.experimental_distribute_dataset(dataset()).begin();
      checkpoint::CheckpointManager mb(b.strategy, dir_);
      b.track(mb);
      mb.track("input", resumed);
      ASSERT_EQ(mb.restore_or_initialize(), 3);
      EXPECT_EQ(resumed.steps_taken(), 3u);
      const auto rest = global_batches(resumed, 100);
      got.insert(got.end(), rest.begin(), rest.end());
      EXPECT_EQ(got, expected);  // the same global batches of 8: every element once
    }
  }
}

TEST_F(ManagerTest, AnIteratorThatCannotResumeElsewhereIsRefusedAndNothingChanges) {
  const auto fn = [](const InputContext& ctx) { return data::range(40).batch(ctx.get_per_replica_batch_size(4)); };
  Model a(2, Opt::adam, false);
  auto input = a.strategy.distribute_datasets_from_function(fn).begin();
  checkpoint::CheckpointManager ma(a.strategy, dir_);
  a.track(ma);
  ma.track("input", input);
  input.get_next();
  a.train(0, 2);
  const std::string path = ma.save(2);

  Model b(4, Opt::adam, false, 5);
  b.train(0, 1);
  const State before = state_of(b);
  auto other = b.strategy.distribute_datasets_from_function(fn).begin();
  checkpoint::CheckpointManager mb(b.strategy, dir_);
  b.track(mb);
  mb.track("input", other);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { mb.restore_or_initialize(); }),
              AllOf(HasSubstr(path), HasSubstr("iterator 'input'"),
                    HasSubstr("saved on 1 worker x 2 replicas, restoring on 1 worker x 4 replicas"),
                    HasSubstr("distribute_datasets_from_function")));
  EXPECT_TRUE(state_of(b) == before);
  EXPECT_EQ(other.steps_taken(), 0u);
  // The iterator is where it was: its first step is the first of its pass (4 elements per replica).
  EXPECT_EQ(other.get_next().values()[0].to_vector(), (std::vector<int64_t>{0}));
}

}  // namespace manager_elastic_test
}  // namespace mirrored
