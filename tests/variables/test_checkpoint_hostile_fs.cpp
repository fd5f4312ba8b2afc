// Checkpoints on a hostile file system: planted symlinks never redirect a save, FIFOs never block a
// load, and directories and unreadable files get errors that say so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "fs_test_util.hpp"
#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr auto kNoBlock = std::chrono::milliseconds(5000);

// Regression: the temporary file was `<path>.tmp`, opened with O_CREAT and
// without O_NOFOLLOW, so a symlink planted there had its target overwritten with the checkpoint.
TEST_F(CheckpointFormat, SymlinkPlantedAtTheOldTempNameIsNotFollowed) {
  const std::string p = file("model.safetensors");
  const std::string victim = file("victim.txt");
  write_file(victim, "precious");
  fs::create_symlink(victim, p + ".tmp");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{1.0f, 2.0f})}});
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_TRUE(fs::is_symlink(p + ".tmp"));  // not ours: left alone
  EXPECT_FALSE(fs::is_symlink(p));
  EXPECT_EQ(checkpoint::load(p).get<float>("w").to_vector(), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(CheckpointFormat, SymlinksPlantedAtTempNamesAreRemovedNotFollowed) {
  const std::string p = file("model.safetensors");
  const std::string victim = file("victim.txt");
  write_file(victim, "precious");
  const std::string prefix = detail::checkpoint_temp_prefix(p);
  EXPECT_EQ(prefix, p + ".tmp.");
  fs::create_symlink(victim, prefix + "0000000000000000");
  fs::create_symlink(file("nowhere"), prefix + "dangling");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{3.0f})}});
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_THAT(save_leftovers(p), IsEmpty());
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 3.0f);
}

TEST_F(CheckpointFormat, SymlinkAsTheLockFileIsRefusedAndChangesNothing) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{1.0f})}});
  const std::string before = read_file(p);
  const std::string victim = file("victim.txt");
  write_file(victim, "precious");
  fs::create_symlink(victim, detail::checkpoint_lock_path(p));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] {
                checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}});
              }),
              AllOf(HasSubstr(p), HasSubstr("lock file"), HasSubstr(detail::checkpoint_lock_path(p))));
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_EQ(read_file(p), before);
  fs::remove(detail::checkpoint_lock_path(p));
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}});
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 2.0f);
}

std::vector<std::string> g_temps;
void record_temp(const std::string& temp, std::uint64_t, std::uint64_t) {
  struct stat st {};
  const bool regular = ::lstat(temp.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
  g_temps.push_back(regular ? temp : "not a fresh regular file: " + temp);
}

TEST_F(CheckpointFormat, EachSaveWritesAFreshUniquelyNamedTempFile) {
  const std::string p = file("model.safetensors");
  g_temps.clear();
  detail::set_checkpoint_fault_hook(record_temp);
  for (int i = 0; i < 3; ++i) checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{float(i)})}});
  detail::set_checkpoint_fault_hook(nullptr);
  ASSERT_EQ(g_temps.size(), 3u);  // one write per save: the header and the small tensor are gathered
  std::set<std::string> names;
  for (const auto& t : g_temps) {
    EXPECT_THAT(t, StartsWith(detail::checkpoint_temp_prefix(p)));
    names.insert(t);
  }
  EXPECT_EQ(names.size(), 3u);
  EXPECT_THAT(save_leftovers(p), IsEmpty());
}

// Regression: load opened a FIFO with a blocking open(2) and waited for a
// writer forever.
TEST_F(CheckpointFormat, LoadingAFifoFailsWithoutBlocking) {
  const std::string p = file("pipe.safetensors");
  ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
  std::string msg;
  const bool in_time = finishes_within(
      kNoBlock, [&] { msg = error_of<InvalidArgumentError>([&] { checkpoint::load(p); }); },
      [&] { release_fifo_reader(p); });
  EXPECT_TRUE(in_time) << "checkpoint::load blocked on a FIFO";
  EXPECT_THAT(msg, AllOf(HasSubstr(p), HasSubstr("is not a regular file (it is a FIFO)")));
}

TEST_F(CheckpointFormat, LoadingADirectoryOrADeviceSaysWhatItIs) {
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(dir_); }),
              AllOf(HasSubstr(dir_), HasSubstr("is a directory")));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load("/dev/null"); }),
              HasSubstr("is not a regular file (it is a character device)"));
}

TEST_F(CheckpointFormat, UnreadableFileIsPermissionDenied) {
  const std::string p = small_checkpoint();
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                            fs::perms::others_exec);
  fs::permissions(p, fs::perms::none);
  const auto result = run_unprivileged([&]() -> int {
    try {
      checkpoint::load(p);
      return 1;
    } catch (const PermissionDeniedError& e) {
      const std::string m = e.what();
      return m.find(p) != std::string::npos && m.find("Permission denied") != std::string::npos ? 0 : 2;
    } catch (...) {
      return 3;
    }
  });
  if (!result) GTEST_SKIP() << "running as root without the right to drop privileges: chmod 000 does not deny";
  EXPECT_EQ(*result, 0) << "1: loaded, 2: message lacks the path or the errno text, 3: another error type";
}

}  // namespace
}  // namespace mirrored
