// Crash safety of checkpoint saves: fault injection, a forked child killed half way, stale temp files
// and concurrent saves.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "child_process.hpp"
#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------------------------
// Crash safety
// ---------------------------------------------------------------------------------------------

/// A checkpoint of 3 write chunks of data, so "half way" falls between chunks.
checkpoint::TensorMap three_chunk_tensors(float value) {
  const auto n = static_cast<int64_t>(detail::kCheckpointChunkBytes / sizeof(float) * 3);
  return {{"big", untyped(Tensor<float>::full({n}, value))}, {"step", untyped(Tensor<int64_t>::scalar(7))}};
}

void throw_half_way(const std::string&, std::uint64_t written, std::uint64_t total) {
  if (written * 2 >= total) throw std::runtime_error("injected fault half way");
}

void exit_half_way(const std::string&, std::uint64_t written, std::uint64_t total) {
  if (written * 2 >= total) ::_exit(42);
}

std::vector<std::uint64_t> g_hook_calls;
void record_calls(const std::string&, std::uint64_t written, std::uint64_t total) {
  g_hook_calls.push_back(written);
  g_hook_calls.push_back(total);
}

TEST_F(CheckpointFormat, FaultHookSeesEveryChunk) {
  const std::string p = file("hooked.safetensors");
  g_hook_calls.clear();
  detail::set_checkpoint_fault_hook(record_calls);
  checkpoint::save_tensors(p, three_chunk_tensors(1.0f));
  detail::set_checkpoint_fault_hook(nullptr);
  const auto size = static_cast<std::uint64_t>(fs::file_size(p));
  // After the header, after each of the 3 chunks of 'big', after 'step'.
  ASSERT_EQ(g_hook_calls.size(), 2u * 5u);
  for (std::size_t i = 1; i < g_hook_calls.size(); i += 2) EXPECT_EQ(g_hook_calls[i], size);
  EXPECT_EQ(g_hook_calls[8], size);
  EXPECT_EQ(g_hook_calls[6] + 8, size);
  EXPECT_EQ(g_hook_calls[4] + detail::kCheckpointChunkBytes, g_hook_calls[6]);
}

TEST_F(CheckpointFormat, ExceptionHalfWayKeepsTheOldCheckpointAndLeavesNoTempFile) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, three_chunk_tensors(1.5f));
  const std::string before = read_file(p);

  detail::set_checkpoint_fault_hook(throw_half_way);
  EXPECT_THROW(checkpoint::save_tensors(p, three_chunk_tensors(2.5f)), std::runtime_error);
  detail::set_checkpoint_fault_hook(nullptr);

  EXPECT_EQ(read_file(p), before);
  EXPECT_THAT(save_leftovers(p), IsEmpty());
  EXPECT_EQ(checkpoint::load(p).get<float>("big").to_vector()[12345], 1.5f);
}

TEST_F(CheckpointFormat, CrashHalfWayKeepsTheOldCheckpointAndTheNextSaveWorks) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, three_chunk_tensors(1.5f));
  const std::string before = read_file(p);

  // A child process starts saving new values and dies (as by a crash or kill -9) half way.
  testing::ChildProcess child([&](const testing::ChildProcess::Ready&) {
    detail::set_checkpoint_fault_hook(exit_half_way);
    checkpoint::save_tensors(p, three_chunk_tensors(2.5f));
    return 1;  // the hook did not fire
  });
  const int status = child.wait();
  ASSERT_TRUE(testing::ChildProcess::exited_with(status, 42))
      << "the child did not die half way through the save (status " << status << ")";

  // The previous checkpoint is untouched, byte for byte, and loads.
  EXPECT_EQ(read_file(p), before);
  const auto old = checkpoint::load(p);
  EXPECT_EQ(old.get<float>("big").to_vector().back(), 1.5f);
  EXPECT_EQ(old.get<int64_t>("step").item(), 7);
  // The dead save's partial temporary file is there (it never got renamed), with its lock file ...
  const auto left = save_leftovers(p);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(file(left[0]), detail::checkpoint_lock_path(p));
  const std::string temp = file(left[1]);
  EXPECT_THAT(temp, StartsWith(detail::checkpoint_temp_prefix(p)));
  EXPECT_LT(fs::file_size(temp), before.size());
  EXPECT_GT(fs::file_size(temp), before.size() / 2);

  // ... and they do not get in the way of the next save, which removes them.
  checkpoint::save_tensors(p, three_chunk_tensors(3.5f));
  EXPECT_THAT(save_leftovers(p), IsEmpty());
  EXPECT_EQ(checkpoint::load(p).get<float>("big").to_vector().front(), 3.5f);
}

TEST_F(CheckpointFormat, StaleTempAndLockFilesAreRemoved) {
  const std::string p = file("model.safetensors");
  // What crashed saves leave: temporary files (longer than the checkpoint) and the lock file.
  write_file(detail::checkpoint_temp_prefix(p) + "0123456789abcdef", std::string(10 << 20, 'x'));
  write_file(detail::checkpoint_temp_prefix(p) + "fedcba9876543210", "");
  write_file(detail::checkpoint_lock_path(p), "");
  write_file(file("other.safetensors.tmp.0123456789abcdef"), "another path's");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{4.0f})}});
  EXPECT_THAT(save_leftovers(p), IsEmpty());
  EXPECT_TRUE(fs::exists(file("other.safetensors.tmp.0123456789abcdef")));
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 4.0f);
}

TEST_F(CheckpointFormat, ConcurrentSaveToTheSamePathIsRefused) {
  const std::string p = file("model.safetensors");
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{1.0f})}});
  const std::string before = read_file(p);
  // Someone else holds the save lock (an in-progress save in another process).
  const std::string lock = detail::checkpoint_lock_path(p);
  const int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  // flock locks belong to the open file, so lock it from another process.
  testing::ChildProcess child([&](const testing::ChildProcess::Ready&) {
    const int cfd = ::open(lock.c_str(), O_WRONLY);
    if (cfd < 0 || ::flock(cfd, LOCK_EX) != 0) return 1;
    ::sleep(30);
    return 0;
  });
  // Wait until the child holds the lock.
  bool locked = false;
  for (int i = 0; i < 500 && !locked; ++i) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      ::flock(fd, LOCK_UN);
      ::usleep(10000);
    } else {
      locked = true;
    }
  }
  ::close(fd);
  if (locked) {
    EXPECT_THAT(error_of<FailedPreconditionError>([&] {
                  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}});
                }),
                AllOf(HasSubstr(p), HasSubstr("another save to this path is in progress")));
    EXPECT_EQ(read_file(p), before);
  }
  child.kill();
  child.wait();
  ASSERT_TRUE(locked) << "the child never took the lock";
  // With the other saver gone, saving works again.
  checkpoint::save_tensors(p, {{"w", untyped(Tensor<float>{2.0f})}});
  EXPECT_EQ(checkpoint::load(p).get<float>("w").item(), 2.0f);
}

}  // namespace
}  // namespace mirrored
