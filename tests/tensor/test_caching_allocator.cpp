// The GPU caching allocator's bookkeeping (src/device/gpu/caching_allocator.hpp), driven by a fake
// device with fake streams and events: runs on every machine, GPU or not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "device/gpu/caching_allocator.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using detail::CachingAllocator;
using ::testing::HasSubstr;

// A device with `capacity` bytes and streams 0, 1, 2, …; counts what the allocator asks of it. A
// stream's work is "enqueued" (`enqueued[s]`, a count) and "finished" (`finished[s]`) as the test
// says; an event is a (stream, count) that is reached once that much work has finished.
struct FakeDevice {
  std::mutex mu;  // like cudaMalloc/cudaFree, the fake is safe to call from several threads
  std::size_t capacity = std::size_t{1} << 30;
  std::size_t used = 0;
  int mallocs = 0, frees = 0;
  int size_mismatches = 0;  // frees whose size differs from the allocation (checked on the main thread)
  std::map<void*, std::size_t> blocks;
  std::map<int, int> enqueued, finished;
  int events_live = 0, event_waits = 0, stream_waits = 0;
  bool events_fail = false;  // record_event cannot make one
  void enqueue(int stream) {
    std::lock_guard lock(mu);
    ++enqueued[stream];
  }
  void finish_all(int stream) {
    std::lock_guard lock(mu);
    finished[stream] = enqueued[stream];
  }
};

struct FakePolicy {
  using Stream = int;
  struct Event {
    int stream = -1;
    int at = 0;
  };
  FakeDevice* dev;
  void* allocate(std::size_t bytes) {
    std::lock_guard lock(dev->mu);
    if (dev->used + bytes > dev->capacity) return nullptr;
    void* p = std::malloc(bytes);
    dev->used += bytes;
    ++dev->mallocs;
    dev->blocks[p] = bytes;
    return p;
  }
  void free(void* p, std::size_t bytes) noexcept {
    std::lock_guard lock(dev->mu);
    dev->size_mismatches += dev->blocks.at(p) != bytes;
    dev->blocks.erase(p);
    dev->used -= bytes;
    ++dev->frees;
    std::free(p);
  }
  std::string describe() const { return "FAKE:0"; }
  bool record_event(Stream s, Event& e) noexcept {
    std::lock_guard lock(dev->mu);
    if (dev->events_fail) return false;
    e = Event{s, dev->enqueued[s]};
    ++dev->events_live;
    return true;
  }
  bool event_reached(const Event& e) noexcept {
    std::lock_guard lock(dev->mu);
    return dev->finished[e.stream] >= e.at;
  }
  void synchronize_event(const Event& e) noexcept {
    std::lock_guard lock(dev->mu);
    ++dev->event_waits;
    dev->finished[e.stream] = std::max(dev->finished[e.stream], e.at);
  }
  void destroy_event(Event&) noexcept {
    std::lock_guard lock(dev->mu);
    --dev->events_live;
  }
  void synchronize_stream(Stream s) noexcept {
    std::lock_guard lock(dev->mu);
    ++dev->stream_waits;
    dev->finished[s] = dev->enqueued[s];
  }
};

using Allocator = CachingAllocator<FakePolicy>;

TEST(CachingAllocator, SizeClassesWasteAtMostAQuarter) {
  EXPECT_EQ(Allocator::size_class(0), 512u);
  EXPECT_EQ(Allocator::size_class(1), 512u);
  EXPECT_EQ(Allocator::size_class(512), 512u);
  EXPECT_EQ(Allocator::size_class(513), 1024u);
  EXPECT_EQ(Allocator::size_class(4096), 4096u);
  EXPECT_EQ(Allocator::size_class(5000), 5120u);
  EXPECT_EQ(Allocator::size_class(std::size_t{256} << 20), std::size_t{256} << 20);
  EXPECT_EQ(Allocator::size_class((std::size_t{256} << 20) + 1), std::size_t{320} << 20);
  for (std::size_t b = 1; b < (std::size_t{1} << 26); b = b * 3 / 2 + 7) {
    const std::size_t c = Allocator::size_class(b);
    ASSERT_GE(c, b);
    if (b > 2048) {
      ASSERT_LE(c, b + b / 4) << b;
    }
    ASSERT_EQ(Allocator::size_class(c), c) << "classes are fixed points";
  }
}

TEST(CachingAllocator, SteadyStateStepsNeverReachTheDevice) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev});
  const std::vector<std::size_t> step = {4, 1000, 4096, 65536, 3 << 20, 4, 4};
  auto run_step = [&] {
    std::vector<void*> live;
    for (std::size_t b : step) live.push_back(a.allocate(b));
    for (void* p : live) a.deallocate(p);
  };
  run_step();
  const int after_first = dev.mallocs;
  EXPECT_EQ(after_first, static_cast<int>(step.size()));
  for (int i = 0; i < 100; ++i) run_step();
  EXPECT_EQ(dev.mallocs, after_first);
  EXPECT_EQ(dev.frees, 0);
  const auto s = a.stats();
  EXPECT_EQ(s.allocations, 101u * step.size());
  EXPECT_EQ(s.cache_hits, 100u * step.size());
  EXPECT_EQ(s.device_allocations, step.size());
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_GT(s.bytes_cached, 0u);
  EXPECT_GE(s.peak_bytes_in_use, std::size_t{3} << 20);
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, ReusesOnlyFreedBlocksOfTheSameClass) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev});
  void* p = a.allocate(1000);
  void* q = a.allocate(1000);
  EXPECT_NE(p, q);
  a.deallocate(p);
  EXPECT_EQ(a.allocate(900), p);  // same class (1024): the cached block
  void* big = a.allocate(5000);   // another class: a new block
  EXPECT_NE(big, p);
  EXPECT_TRUE(a.owns(big));
  EXPECT_FALSE(a.owns(&dev));
  a.deallocate(big);
  EXPECT_FALSE(a.owns(big));
  a.deallocate(p);
  a.deallocate(q);
  EXPECT_EQ(dev.mallocs, 3);
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeDevice dev;
  dev.capacity = 10000;
  Allocator a(FakePolicy{&dev});
  int callbacks = 0;
  a.set_on_out_of_memory([&] { ++callbacks; });
  void* p = a.allocate(4096);
  void* q = a.allocate(4096);
  a.deallocate(p);
  a.deallocate(q);               // 8192 bytes cached, 1808 free on the device
  void* big = a.allocate(8000);  // class 8192: only fits once the cache is gone
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(callbacks, 1);
  EXPECT_EQ(dev.frees, 2);
  EXPECT_EQ(a.stats().out_of_memory_retries, 1u);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  // Still too much: a typed error naming the device.
  const std::string msg = testing::message_of<UnavailableError>([&] { (void)a.allocate(9000); });
  EXPECT_THAT(msg, HasSubstr("out of memory on FAKE:0"));
  EXPECT_THAT(msg, HasSubstr("cannot allocate 9000 bytes"));
  EXPECT_EQ(callbacks, 2);
  a.deallocate(big);
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, CacheLimitSendsBlocksBack) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev}, /*cache_limit=*/4096);
  void* p = a.allocate(4096);
  void* q = a.allocate(4096);
  a.deallocate(p);  // cached
  a.deallocate(q);  // over the limit: back to the device
  EXPECT_EQ(dev.frees, 1);
  EXPECT_EQ(a.stats().bytes_cached, 4096u);
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, ReleaseAndDestructionFreeTheCache) {
  FakeDevice dev;
  {
    Allocator a(FakePolicy{&dev});
    std::vector<void*> blocks;
    for (int i = 0; i < 5; ++i) blocks.push_back(a.allocate(1 << (10 + i)));
    for (int i = 0; i < 3; ++i) a.deallocate(blocks[i]);
    a.release_cached();
    EXPECT_EQ(dev.frees, 3);
    a.deallocate(blocks[3]);
    a.deallocate(nullptr);                   // ignored
    a.deallocate(static_cast<void*>(&dev));  // unknown: ignored
    a.deallocate(blocks[4]);
  }
  EXPECT_EQ(dev.frees, 5);
  EXPECT_TRUE(dev.blocks.empty());
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, ThreadsShareItSafely) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev});
  testing::run_ranks(4, [&](int r) {
    for (int i = 0; i < 2000; ++i) {
      void* p = a.allocate(static_cast<std::size_t>(512 * (1 + (i + r) % 7)));
      static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(r);
      a.deallocate(p);
    }
  });
  const auto s = a.stats();
  EXPECT_EQ(s.allocations, 8000u);
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(dev.mallocs, 4 * 7);  // at most one block per class per thread in flight
  EXPECT_EQ(dev.size_mismatches, 0);
}

// Per-stream pools: a block freed on its own stream is reused at once there (later work is ordered
// after its last use), never on another stream (whose work is not).
TEST(CachingAllocator, BlocksAreReusedOnlyOnTheirOwnStream) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev});
  void* p = a.allocate(4096, 1);
  dev.enqueue(1);  // work on stream 1 still uses p
  a.deallocate(p);
  void* q = a.allocate(4096, 2);
  EXPECT_NE(q, p) << "stream 2 got a block stream 1 may still be using";
  void* again = a.allocate(4096, 1);
  EXPECT_EQ(again, p);  // stream order makes this safe
  EXPECT_EQ(dev.mallocs, 2);
  // Blocks in use are the caller's: the allocator frees only what it caches.
  a.deallocate(again);
  a.deallocate(q);
}

// PyTorch's record_stream: a block that stream 2 also uses is held back when freed until the
// event recorded on stream 2 at that moment is reached; blocks without such use are not held.
TEST(CachingAllocator, ABlockUsedOnAnotherStreamWaitsForThatWork) {
  FakeDevice dev;
  Allocator a(FakePolicy{&dev});
  void* p = a.allocate(4096, 1);
  a.record_stream(p, 2);
  a.record_stream(p, 1);     // its own stream: nothing to note
  a.record_stream(&dev, 2);  // not a block of this allocator: ignored
  dev.enqueue(2);            // stream 2's work on p is still running
  a.deallocate(p);
  EXPECT_EQ(a.stats().blocks_held_back, 1u);
  EXPECT_EQ(a.stats().bytes_cached, 4096u);
  void* q = a.allocate(4096, 1);
  EXPECT_NE(q, p) << "p was handed out again while stream 2 may still write it";
  dev.enqueue(2);  // later work on stream 2 does not keep p: only what was queued when it was freed
  dev.finished[2] = 1;
  void* r = a.allocate(4096, 1);
  EXPECT_EQ(r, p);
  EXPECT_EQ(a.stats().blocks_held_back, 0u);
  EXPECT_EQ(dev.events_live, 0);
  // Once freed again without use elsewhere, it is reused at once.
  a.deallocate(r);
  void* again = a.allocate(4096, 1);
  EXPECT_EQ(again, p);
  a.deallocate(again);
  a.deallocate(q);
  EXPECT_EQ(dev.size_mismatches, 0);
}

TEST(CachingAllocator, ReleaseWaitsForHeldBackBlocks) {
  FakeDevice dev;
  {
    Allocator a(FakePolicy{&dev});
    void* p = a.allocate(1000, 0);
    a.record_stream(p, 3);
    dev.enqueue(3);
    a.deallocate(p);
    a.release_cached();
    EXPECT_EQ(dev.event_waits, 1);
    EXPECT_EQ(dev.frees, 1);
    EXPECT_EQ(dev.events_live, 0);
    EXPECT_EQ(a.stats().bytes_cached, 0u);
    EXPECT_EQ(a.stats().blocks_held_back, 0u);
  }
  EXPECT_TRUE(dev.blocks.empty());
}

// Without an event the allocator waits for the other stream's work before caching the block.
TEST(CachingAllocator, NoEventMeansWaitingForTheOtherStream) {
  FakeDevice dev;
  dev.events_fail = true;
  Allocator a(FakePolicy{&dev});
  void* p = a.allocate(1000, 0);
  a.record_stream(p, 1);
  dev.enqueue(1);
  a.deallocate(p);
  EXPECT_EQ(dev.stream_waits, 1);
  EXPECT_EQ(dev.finished[1], 1);
  void* again = a.allocate(1000, 0);
  EXPECT_EQ(again, p);
  a.deallocate(again);
}

}  // namespace
}  // namespace mirrored
