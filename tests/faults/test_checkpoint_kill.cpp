// Fault injection: a process saving a checkpoint is killed (SIGKILL) at random points, 50 times
// (20 under the sanitizers).
// After every kill the file at the path is a complete checkpoint, the last one committed (or the
// new one, when the kill came after its rename), byte for byte, and restores bit-exact.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <random>
#include <thread>
#include <utility>

#include <mirrored/variable_checkpoint.hpp>

#include "child_process.hpp"
#include "harness.hpp"
#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers

// Each kill costs about 1.3 s under ASan (the model is generated and compared at -O0 with every
// access checked); 20 random points there, 50 in the debug stage.
constexpr int kKills = kSanitized ? 20 : 50;
// Two full write chunks and a part of a third, so that the writes have several steps.
constexpr int64_t kBigFloats = static_cast<int64_t>(detail::kCheckpointChunkBytes / sizeof(float) * 2 + 1000);

/// Version `k` of the model: arbitrary bit patterns (NaN payloads, denormals, -0.0 included), so
/// that "bit-exact" means exactly that.
checkpoint::TensorMap version(int k) {
  uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(k + 1);
  auto next = [&] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  Tensor<float> big = Tensor<float>::empty({kBigFloats});
  auto* words = reinterpret_cast<uint32_t*>(big.data());
  for (int64_t i = 0; i < kBigFloats; ++i) words[i] = static_cast<uint32_t>(next());
  Tensor<double> bias = Tensor<double>::empty({7});
  auto* longs = reinterpret_cast<uint64_t*>(bias.data());
  for (int i = 0; i < 7; ++i) longs[i] = next();
  return {{"big", untyped(big)}, {"bias", untyped(bias)}, {"step", untyped(Tensor<int64_t>::scalar(k))}};
}

std::string bytes_of(const detail::UntypedTensor& t) {
  return std::string(static_cast<const char*>(t.data()), t.bytes());
}

uint64_t g_kill_at = 0;  // the child's fault hook kills the process once this many bytes are written
void kill_when_reached(const std::string&, std::uint64_t written, std::uint64_t) {
  if (written >= g_kill_at) ::raise(SIGKILL);
}

class CheckpointKill : public CheckpointFormat {};

TEST_F(CheckpointKill, KilledAtRandomPointsThePreviousCheckpointAlwaysRestoresBitExact) {
  const std::string p = file("model.safetensors");
  const auto start = std::chrono::steady_clock::now();
  checkpoint::TensorMap committed_map = version(0);
  checkpoint::save_tensors(p, committed_map);
  const auto save_time = std::chrono::steady_clock::now() - start;
  const std::uint64_t total = fs::file_size(p);
  std::string committed_bytes = read_file(p);
  int committed = 0;

  const unsigned seed = std::random_device{}();
  std::cout << "[ faults ] seed " << seed << ", one save takes about "
            << std::chrono::duration_cast<std::chrono::microseconds>(save_time).count() / 1000.0 << " ms\n";
  std::mt19937 rng(seed);
  int kept_old = 0, got_new = 0, finished = 0;
  for (int i = 1; i <= kKills; ++i) {
    SCOPED_TRACE("kill " + std::to_string(i) + " (seed " + std::to_string(seed) + ")");
    checkpoint::TensorMap next = version(i);
    // Odd kills: the process kills itself when the writes reach a random byte (between chunks).
    // Even kills: the parent sends SIGKILL after a random delay, anywhere in the save (the
    // writes, the fsyncs, the rename, the directory fsync) or after it.
    const bool self = i % 2 == 1;
    const std::uint64_t kill_at = std::uniform_int_distribution<std::uint64_t>(1, total)(rng);
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(save_time).count() * 3 / 2)(rng));
    testing::ChildProcess child([&](const testing::ChildProcess::Ready& ready) {
      if (self) {
        g_kill_at = kill_at;
        detail::set_checkpoint_fault_hook(kill_when_reached);
      }
      ready();
      checkpoint::save_tensors(p, next);
      return 0;
    });
    ASSERT_TRUE(child.wait_ready());
    if (!self) {
      std::this_thread::sleep_for(delay);
      child.kill();
    }
    const int status = child.wait();
    const bool killed = testing::ChildProcess::killed_by(status, SIGKILL);
    ASSERT_TRUE(killed || testing::ChildProcess::exited_with(status, 0))
        << "the saving child failed on its own (status " << status << ")";
    finished += killed ? 0 : 1;

    // The file is one complete checkpoint: the last committed one, or the new one (a kill after
    // the rename, or no kill at all) — never a mix, never a partial file.
    const std::string now = read_file(p);
    const checkpoint::Checkpoint ck = checkpoint::load(p);  // checksum and structure verified
    const int step = static_cast<int>(ck.get<int64_t>("step").item());
    if (killed && step == committed) {
      ++kept_old;
      EXPECT_EQ(now, committed_bytes);
    } else {
      ASSERT_EQ(step, i) << "neither the previous checkpoint nor the new one";
      ++got_new;
      committed = i;
      committed_bytes = now;
      committed_map = std::move(next);
    }
    // It restores bit-exact into variables.
    Variable<float> big(Tensor<float>::zeros({kBigFloats}));
    Variable<double> bias(Tensor<double>::zeros({7}));
    Variable<int64_t> step_var(int64_t{-1});
    checkpoint::restore(p, {{"big", big}, {"bias", bias}, {"step", step_var}});
    EXPECT_EQ(bytes_of(checkpoint::untyped(big.value())), bytes_of(committed_map.at("big")));
    EXPECT_EQ(bytes_of(checkpoint::untyped(bias.value())), bytes_of(committed_map.at("bias")));
    EXPECT_EQ(step_var.value().item(), committed);
    // A killed save leaves at most its temporary file and the lock; the next save clears them,
    // so they never pile up.
    EXPECT_LE(save_leftovers(p).size(), 2u);
  }
  std::cout << "[ faults ] " << kKills << " kills: " << kept_old << " left the previous checkpoint, " << got_new
            << " the new one (" << finished << " saves finished before the kill)\n";
  EXPECT_GT(kept_old, 0) << "no kill landed inside a save";

  // The parent saves again over whatever the kills left.
  checkpoint::save_tensors(p, version(kKills + 1));
  EXPECT_THAT(save_leftovers(p), ::testing::IsEmpty());
  EXPECT_EQ(checkpoint::load(p).get<int64_t>("step").item(), kKills + 1);
}

}  // namespace
}  // namespace mirrored
