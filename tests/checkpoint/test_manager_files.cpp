// CheckpointManager's files: a process killed (SIGKILL) anywhere in a save leaves the previous
// checkpoint usable (the restart restores it, or the new one when the kill came after the index
// was written), and the next save leaves no temporary or lock file behind; stray temporary files
// of crashed saves are removed; Python's safetensors reads a manager's checkpoint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/manager_test_util.hpp"
#include "child_process.hpp"

namespace mirrored {
namespace manager_files_test {

using namespace manager_testing;  // NOLINT: the manager test helpers
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kKills = mirrored::testing::kSanitized ? 6 : 12;
// Two full write chunks and a part of a third: the data file's writes take several steps.
constexpr int64_t kBig = static_cast<int64_t>(detail::kCheckpointChunkBytes / sizeof(float) * 2 + 1000);

/// Version `k` of the big tensor: arbitrary bit patterns.
Tensor<float> version(int64_t k) {
  Tensor<float> t = Tensor<float>::empty({kBig});
  auto* words = reinterpret_cast<uint32_t*>(t.data());
  uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(k + 1);
  for (int64_t i = 0; i < kBig; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = static_cast<uint32_t>(x);
  }
  return t;
}

/// Names of crashed or running saves' files: temporary and lock files.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : listing(dir))
    if (name.find(".tmp.") != std::string::npos || name.find(".lock") != std::string::npos) out.push_back(name);
  return out;
}

uint64_t g_kill_at = 0;
void kill_when_reached(const std::string&, std::uint64_t written, std::uint64_t) {
  if (written >= g_kill_at) ::raise(SIGKILL);
}

/// The model of this test: plain variables (the default strategy) and the manager on `dir`.
struct Plain {
  explicit Plain(const std::string& dir)
      : big(Tensor<float>::zeros({kBig})), step(int64_t{-1}), m(get_strategy(), dir) {
    m.track("big", big);
    m.track("step", step);
  }
  Variable<float> big;
  Variable<int64_t> step;
  checkpoint::CheckpointManager m;
};

TEST_F(ManagerTest, KilledMidSaveTheRestartUsesThePreviousCheckpointAndTheNextSaveLeavesNoTemporaryFile) {
  int64_t committed = 1;
  std::chrono::steady_clock::duration save_time{};
  {
    Plain p(dir_);
    p.big.assign(version(1));
    p.step.assign(int64_t{1});
    const auto start = std::chrono::steady_clock::now();
    p.m.save(1);
    save_time = std::chrono::steady_clock::now() - start;
  }
  const std::uint64_t total = fs::file_size(file("ckpt-1.safetensors"));
  const unsigned seed = std::random_device{}();
  std::cout << "[ manager ] seed " << seed << "\n";
  std::mt19937 rng(seed);
  int self_kills_with_leftovers = 0;
  for (int i = 1; i <= kKills; ++i) {
    SCOPED_TRACE("kill " + std::to_string(i) + " (seed " + std::to_string(seed) + ")");
    const int64_t next = committed + 1;
    // Odd kills: the child kills itself when the data file's writes reach a random byte. Even
    // kills: the parent kills it after a random delay, anywhere in the save (data file, index,
    // deletions) or after it.
    const bool self = i % 2 == 1;
    const std::uint64_t kill_at = std::uniform_int_distribution<std::uint64_t>(1, total)(rng);
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::microseconds>(save_time).count() * 3 / 2)(rng));
    testing::ChildProcess child([&](const testing::ChildProcess::Ready& ready) {
      Plain p(dir_);
      p.big.assign(version(next));
      p.step.assign(next);
      if (self) {
        g_kill_at = kill_at;
        detail::set_checkpoint_fault_hook(kill_when_reached);
      }
      ready();
      p.m.save(next);
      return 0;
    });
    ASSERT_TRUE(child.wait_ready());
    if (!self) {
      std::this_thread::sleep_for(delay);
      child.kill();
    }
    const int status = child.wait();
    const bool killed = testing::ChildProcess::killed_by(status, SIGKILL);
    ASSERT_TRUE(killed || testing::ChildProcess::exited_with(status, 0)) << "status " << status;
    if (self) {
      ASSERT_TRUE(killed);
      if (!leftovers(dir_).empty()) ++self_kills_with_leftovers;
    }

    // The restart: the previous checkpoint, or the new one if the kill came after its index.
    Plain restart(dir_);
    const std::optional<int64_t> restored = restart.m.restore_or_initialize();
    ASSERT_TRUE(restored.has_value());
    if (self) {
      EXPECT_EQ(*restored, committed);  // killed while writing the data file
    }
    EXPECT_TRUE(*restored == committed || *restored == next) << *restored;
    EXPECT_EQ(restart.step.value().item(), *restored);
    EXPECT_EQ(bits(restart.big.value()), bits(version(*restored)));
    committed = *restored;

    // The next save cleans up after the crash: no file of the killed save survives it (the
    // spares of the killed manager neither: the restarted one keeps at most two of its own).
    const std::vector<std::string> before = spares(dir_);
    restart.m.save(committed);
    EXPECT_THAT(leftovers(dir_), ElementsAre());
    for (const auto& name : listing_but_spares(dir_))
      EXPECT_TRUE(name == "checkpoint" || name.rfind("ckpt-", 0) == 0) << name;
    const std::vector<std::string> after = spares(dir_);
    EXPECT_LE(after.size(), 2u);
    for (const auto& name : after) EXPECT_EQ(std::count(before.begin(), before.end(), name), 0) << name;
  }
  EXPECT_EQ(self_kills_with_leftovers, (kKills + 1) / 2);  // each left its temporary file
}

TEST_F(ManagerTest, StrayFilesOfCrashedSavesAreRemovedByTheNextSave) {
  Variable<float> w(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  m.save(1);
  for (const char* name : {"ckpt-7.safetensors.tmp.0123456789abcdef", "ckpt-7.safetensors.lock",
                           "checkpoint.tmp.00000000deadbeef", "checkpoint.lock", "ckpt-9.safetensors",
                           ".ckpt-spare.0123456789abcdef"})  // the last: a spare of a manager gone
    write_file(file(name), "partial");
  write_file(file("notes.txt"), "the user's");  // not the manager's: stays
  m.save(2);
  EXPECT_THAT(listing_but_spares(dir_),
              ElementsAre("checkpoint", "ckpt-1.safetensors", "ckpt-2.safetensors", "notes.txt"));
  // Left: this manager's spares (ckpt-9's file, the replaced index), not the planted one.
  EXPECT_EQ(spares(dir_).size(), 2u);
  EXPECT_FALSE(fs::exists(file(".ckpt-spare.0123456789abcdef")));
}

TEST_F(ManagerTest, ADroppedCheckpointsFileIsWrittenIntoByTheNextSaveAndTheSparesGoWithTheManager) {
  Variable<float> w(Tensor<float>{1.0f, 2.0f, 3.0f});
  {
    checkpoint::CheckpointManager m(get_strategy(), dir_, /*max_to_keep=*/1);
    m.track("w", w);
    m.set_metadata("note", std::string(5000, 'x'));  // makes the first files longer than the later ones
    m.save(1);
    m.save(2);  // drops ckpt-1: its file becomes the spare
    std::vector<std::string> kept = spares(dir_);
    ASSERT_EQ(kept.size(), 2u);  // ckpt-1's file and the replaced index
    struct stat a {
    }, b{};
    ASSERT_EQ(::stat(file(kept[0]).c_str(), &a), 0);
    ASSERT_EQ(::stat(file(kept[1]).c_str(), &b), 0);
    const struct stat& data_spare = a.st_size > b.st_size ? a : b;
    m.set_metadata("note", "short");
    w.assign(Tensor<float>{7.0f, 8.0f, 9.0f});
    m.save(3);  // written into ckpt-1's old file, cut to its new length
    struct stat now {};
    ASSERT_EQ(::stat(file("ckpt-3.safetensors").c_str(), &now), 0);
    EXPECT_EQ(now.st_ino, data_spare.st_ino);
    EXPECT_LT(now.st_size, data_spare.st_size);
    EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-3.safetensors"));
    EXPECT_EQ(spares(dir_).size(), 2u);
  }
  EXPECT_THAT(listing(dir_), ElementsAre("checkpoint", "ckpt-3.safetensors"));  // the destructor removed the spares
  w.assign(Tensor<float>{0.0f, 0.0f, 0.0f});
  checkpoint::CheckpointManager again(get_strategy(), dir_, 1);
  again.track("w", w);
  EXPECT_EQ(again.restore_or_initialize(), std::optional<int64_t>(3));
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{7.0f, 8.0f, 9.0f}));
  EXPECT_EQ(again.metadata("note"), std::optional<std::string>("short"));
}

TEST_F(ManagerTest, ASpareReplacedByASymlinkOrLinkedElsewhereIsNeverWrittenThrough) {
  Variable<float> w(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_, /*max_to_keep=*/1);
  m.track("w", w);
  const std::string victim = root_ + "/victim.bin";
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "symlinks" : "hard links");
    write_file(victim, "not a checkpoint");
    m.save(10 * round + 1);
    m.save(10 * round + 2);
    const std::vector<std::string> kept = spares(dir_);
    ASSERT_EQ(kept.size(), 2u);
    for (const auto& name : kept) {
      fs::remove(file(name));
      if (round == 0)
        fs::create_symlink(victim, file(name));
      else
        fs::create_hard_link(victim, file(name));
    }
    w.assign(Tensor<float>{static_cast<float>(round + 5)});
    m.save(10 * round + 3);
    EXPECT_EQ(read_file(victim), "not a checkpoint");
    for (const auto& name : kept) EXPECT_FALSE(fs::exists(fs::symlink_status(file(name)))) << name;
    EXPECT_EQ(
        checkpoint::load(file("ckpt-" + std::to_string(10 * round + 3) + ".safetensors")).get<float>("w").to_vector(),
        (std::vector<float>{static_cast<float>(round + 5)}));
    fs::remove(victim);
  }
}

/// A Python interpreter with `safetensors` and `numpy`, or "" when there is none.
std::string python_with_safetensors() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string cmd = std::string(py) + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

TEST_F(ManagerTest, PythonSafetensorsReadsTheManagersCheckpoints) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";
  Model a(2, Opt::adam, /*sharded=*/true);
  checkpoint::CheckpointManager m(a.strategy, dir_);
  a.track(m);
  FakeIterator it{.position = 12, .replicas = 2};
  track_fake(m, "it", it);
  m.set_metadata("epoch", "4");
  a.train(0, 2);
  const std::string path = m.save(2);

  // Python lists every tensor as "name dtype shape crc32-of-bytes" and the metadata it needs.
  const std::string script = root_ + "/check.py";
  write_file(script, R"PY(
import sys, zlib
from safetensors import safe_open
from safetensors.numpy import load_file
got = load_file(sys.argv[1])
for name in sorted(got):
    a = got[name]
    print(name, a.dtype, list(a.shape), "%08x" % zlib.crc32(a.tobytes()))
with safe_open(sys.argv[1], framework="np") as f:
    meta = f.metadata()
print("meta", meta["epoch"], meta["mirrored.manager.step"])
)PY");
  const std::string out_file = root_ + "/out.txt";
  ASSERT_EQ(std::system((py + " " + script + " " + path + " > " + out_file + " 2>&1").c_str()), 0)
      << read_file(out_file);
  std::ostringstream want;
  const checkpoint::Checkpoint ckpt = checkpoint::load(path);
  for (const auto& [name, t] : ckpt.tensors()) {
    const char* np = t.dtype == DType::float32 ? "float32" : t.dtype == DType::int64 ? "int64" : "uint8";
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", detail::checkpoint_crc32(0, t.data(), t.bytes()));
    want << name << " " << np << " [";
    for (std::size_t d = 0; d < t.shape.size(); ++d) want << (d ? ", " : "") << t.shape[d];
    want << "] " << crc << "\n";
  }
  want << "meta 4 2\n";
  EXPECT_EQ(read_file(out_file), want.str());
  EXPECT_THAT(read_file(out_file), HasSubstr("optimizer/dense/kernel/m float32 [7, 3]"));
}

}  // namespace manager_files_test
}  // namespace mirrored
