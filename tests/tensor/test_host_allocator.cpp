// The host allocator's large-block bookkeeping, which the CUDA part uses to pin the block behind
// a host tensor once (src/device/cuda: prefetch to a GPU) and to unpin it before it goes back to the
// system.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device/host/host_allocator.hpp"

namespace mirrored::detail {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(HostAllocator, FindsTheLargeBlockHoldingAnInteriorPointer) {
  void* p = host_allocate(3 * kMiB + 5);
  auto* bytes = static_cast<unsigned char*>(p);
  for (std::size_t offset : {std::size_t{0}, std::size_t{1}, kMiB, 3 * kMiB + 4}) {
    const HostBlock b = host_block_containing(bytes + offset);
    EXPECT_EQ(b.base, p) << "offset " << offset;
    EXPECT_GE(b.size, 3 * kMiB + 5) << "offset " << offset;
  }
  // One past the rounded block is not in it.
  const HostBlock whole = host_block_containing(p);
  EXPECT_NE(host_block_containing(bytes + whole.size).base, p);
  host_deallocate(p, 3 * kMiB + 5);
  // A cached block is not handed out, so nothing holds it any more.
  EXPECT_EQ(host_block_containing(p).base, nullptr);
}

TEST(HostAllocator, SmallAndForeignMemoryIsInNoBlock) {
  void* small = host_allocate(4096);
  EXPECT_EQ(host_block_containing(small).base, nullptr);
  host_deallocate(small, 4096);
  std::vector<unsigned char> foreign(2 * kMiB);
  EXPECT_EQ(host_block_containing(foreign.data() + kMiB).base, nullptr);
}

std::mutex released_mu;
std::vector<std::pair<void*, std::size_t>> released;

void record_release(void* base, std::size_t size) noexcept {
  std::lock_guard lock(released_mu);
  released.emplace_back(base, size);
}

TEST(HostAllocator, TheReleaseHookSeesEveryBlockBeforeItIsFreed) {
  void* p = host_allocate(5 * kMiB);
  const HostBlock block = host_block_containing(p);
  ASSERT_EQ(block.base, p);
  set_host_block_release_hook(&record_release);
  host_deallocate(p, 5 * kMiB);  // cached: not freed yet
  {
    std::lock_guard lock(released_mu);
    for (const auto& r : released) EXPECT_NE(r.first, p) << "released while still cached";
  }
  host_release_cached();
  set_host_block_release_hook(nullptr);
  std::lock_guard lock(released_mu);
  bool seen = false;
  for (const auto& r : released) {
    if (r.first != p) continue;
    seen = true;
    EXPECT_EQ(r.second, block.size);
  }
  EXPECT_TRUE(seen) << "the hook did not see the block when the cache released it";
  released.clear();
}

// Run by the ctest tensor.host_cache_disabled with MIRRORED_HOST_CACHE_MB=0 (skipped otherwise, since
// the cache reads the variable once per process).
TEST(HostAllocatorEnvironment, ZeroMegabytesDisablesTheCache) {
  const char* env = std::getenv("MIRRORED_HOST_CACHE_MB");
  if (!env || std::string(env) != "0")
    GTEST_SKIP() << "needs MIRRORED_HOST_CACHE_MB=0 (ctest tensor.host_cache_disabled)";
  void* p = host_allocate(4 * kMiB);
  host_deallocate(p, 4 * kMiB);
  EXPECT_EQ(host_cached_bytes(), 0u);
}

}  // namespace
}  // namespace mirrored::detail
