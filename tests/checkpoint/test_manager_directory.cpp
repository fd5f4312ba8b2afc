// CheckpointManager's directory as the index and the file names describe it: two managers saving
// into one directory (one after the other, as two processes would under the directory's lock) keep
// each other's checkpoints, and every step `save` accepts -- the whole non-negative int64 range --
// is found again by `latest_checkpoint` and restored.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint/manager_test_util.hpp"

namespace mirrored {
namespace manager_directory_test {

using namespace manager_testing;  // NOLINT: the manager test helpers
using ::testing::ElementsAre;

/// The index text listing `names`, oldest first.
std::string index_of(const std::vector<std::string>& names) {
  std::string out = "model_checkpoint_path: \"" + names.back() + "\"\n";
  for (const auto& n : names) out += "all_model_checkpoint_paths: \"" + n + "\"\n";
  return out;
}

/// Two managers of one directory, each tracking its own variable under the same name.
struct TwoManagers {
  TwoManagers(const std::string& dir, int max_to_keep)
      : a_value(Tensor<float>{0.0f}),
        b_value(Tensor<float>{0.0f}),
        a(get_strategy(), dir, max_to_keep),
        b(get_strategy(), dir, max_to_keep) {
    a.track("w", a_value);
    b.track("w", b_value);
  }
  void save(checkpoint::CheckpointManager& m, Variable<float>& v, int64_t step) {
    v.assign(Tensor<float>{static_cast<float>(step)});
    m.save(step);
  }
  Variable<float> a_value, b_value;
  checkpoint::CheckpointManager a, b;
};

TEST_F(ManagerTest, TwoManagersOfOneDirectoryKeepEachOthersCheckpoints) {
  TwoManagers t(dir_, 5);
  t.save(t.a, t.a_value, 1);
  t.save(t.b, t.b_value, 2);
  t.save(t.b, t.b_value, 3);
  t.save(t.a, t.a_value, 4);
  EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-1.safetensors", "ckpt-2.safetensors",
                                                    "ckpt-3.safetensors", "ckpt-4.safetensors"));
  EXPECT_EQ(read_file(file("checkpoint")),
            index_of({"ckpt-1.safetensors", "ckpt-2.safetensors", "ckpt-3.safetensors", "ckpt-4.safetensors"}));
  EXPECT_EQ(t.a.latest_checkpoint(), file("ckpt-4.safetensors"));
  EXPECT_EQ(t.b.latest_checkpoint(), file("ckpt-4.safetensors"));
  t.b_value.assign(Tensor<float>{0.0f});
  EXPECT_EQ(t.b.restore_or_initialize(), 4);
  EXPECT_EQ(t.b_value.value().item(), 4.0f);
}

TEST_F(ManagerTest, TwoManagersOfOneDirectoryDropTheOldestOfBothSaves) {
  TwoManagers t(dir_, 2);
  t.save(t.a, t.a_value, 1);
  t.save(t.b, t.b_value, 2);
  t.save(t.b, t.b_value, 3);
  t.save(t.a, t.a_value, 4);
  EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-3.safetensors", "ckpt-4.safetensors"));
  EXPECT_EQ(read_file(file("checkpoint")), index_of({"ckpt-3.safetensors", "ckpt-4.safetensors"}));
  // And the other way round: B's next save keeps A's newest.
  t.save(t.b, t.b_value, 5);
  EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-4.safetensors", "ckpt-5.safetensors"));
  EXPECT_EQ(read_file(file("checkpoint")), index_of({"ckpt-4.safetensors", "ckpt-5.safetensors"}));
}

TEST_F(ManagerTest, StepsOfNineteenDigitsAreTheLatestAndRestore) {
  constexpr int64_t kNanoseconds = 1'700'000'000'000'000'000;  // a timestamp in ns as the step
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Variable<float> w(Tensor<float>{0.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_, /*max_to_keep=*/2);
  m.track("w", w);
  for (const int64_t step : {int64_t{999'999'999'999'999'999}, kNanoseconds}) {
    w.assign(Tensor<float>{static_cast<float>(step % 1000 + 1)});
    m.save(step);
  }
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-1700000000000000000.safetensors"));
  w.assign(Tensor<float>{0.0f});
  EXPECT_EQ(m.restore_or_initialize(), kNanoseconds);
  EXPECT_EQ(w.value().item(), 1.0f);

  w.assign(Tensor<float>{8.0f});
  m.save(kMax);
  EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-1700000000000000000.safetensors",
                                                    "ckpt-9223372036854775807.safetensors"));
  EXPECT_EQ(read_file(file("checkpoint")),
            index_of({"ckpt-1700000000000000000.safetensors", "ckpt-9223372036854775807.safetensors"}));
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-9223372036854775807.safetensors"));
  // Without the index, the scan orders them by step.
  fs::remove(file("checkpoint"));
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-9223372036854775807.safetensors"));
  w.assign(Tensor<float>{0.0f});
  EXPECT_EQ(m.restore_or_initialize(), kMax);
  EXPECT_EQ(w.value().item(), 8.0f);
}

TEST_F(ManagerTest, AFileNameBeyondTheInt64RangeIsNoCheckpoint) {
  Variable<float> w(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  m.save(7);
  fs::remove(file("checkpoint"));
  // INT64_MAX + 1, and 20 digits: names no save writes, which must not wrap to a step.
  write_file(file("ckpt-9223372036854775808.safetensors"), "x");
  write_file(file("ckpt-10000000000000000000.safetensors"), "x");
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-7.safetensors"));
  EXPECT_EQ(m.restore_or_initialize(), 7);
}

}  // namespace manager_directory_test
}  // namespace mirrored
