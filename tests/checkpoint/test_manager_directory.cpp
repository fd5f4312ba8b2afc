// CheckpointManager's directory as the index and the file names describe it: two managers saving
// into one directory (one after the other, as two processes would under the directory's lock) keep
// each other's checkpoints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace manager_directory_test
}  // namespace mirrored
