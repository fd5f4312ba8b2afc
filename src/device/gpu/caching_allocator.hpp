#pragma once
// Private: the bookkeeping of the per-device caching allocator of the GPU platforms (the CUDA
// backend, the simulated GPU), independent of either so that it is tested on any machine
// (tests/tensor/test_caching_allocator.cpp drives it with a fake policy).
//
// Blocks are rounded up to size classes (at most 25% larger than asked for, 512 bytes minimum)
// and freed blocks are kept per stream and class for reuse, so a training loop that allocates the
// same tensors every step stops calling the device allocator after its first step.
//
// Streams. A block belongs to the stream it was allocated for. Freed while work on that stream
// may still use it, it can be handed out again at once *for that stream*, because every later use
// is ordered after that work (like PyTorch's caching allocator); it is never handed to another
// stream. A block that work on other streams also uses (`record_stream`, PyTorch's
// `record_stream`) is held back when freed: an event is recorded on each of those streams, and
// the block is reused only once all of them are reached.
//
// Policy (copied in):
//   using Stream = …;  (copyable, ==, <; `Stream{}` is the default stream)
//   using Event = …;   (copyable)
//   void* allocate(std::size_t bytes);  nullptr when the device is out of memory; throws a
//                                       mirrored error for anything else
//   void free(void* p, std::size_t bytes) noexcept;  returns `p` to the device, which must not
//                                       touch it afterwards (cudaFree waits for the device)
//   std::string describe() const;       names the device for messages
//   bool record_event(Stream s, Event& e) noexcept;  a new event recorded on `s` now; false when
//                                       none could be made
//   bool event_reached(const Event& e) noexcept;
//   void synchronize_event(const Event& e) noexcept;  blocks until reached
//   void destroy_event(Event& e) noexcept;
//   void synchronize_stream(Stream s) noexcept;  blocks until `s`'s work so far has finished

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mirrored/errors.hpp"

namespace mirrored::detail {

/// Counters of a caching allocator (a snapshot).
struct CachingAllocatorStats {
  uint64_t allocations = 0;         ///< calls to allocate
  uint64_t cache_hits = 0;          ///< served from the cache
  uint64_t device_allocations = 0;  ///< calls to the policy's allocate that succeeded
  uint64_t device_frees = 0;        ///< calls to the policy's free
  uint64_t out_of_memory_retries = 0;
  std::size_t bytes_in_use = 0;  ///< size-class bytes handed out and not yet returned
  std::size_t bytes_cached = 0;  ///< size-class bytes kept for reuse (held-back blocks included)
  std::size_t peak_bytes_in_use = 0;
  std::size_t blocks_held_back = 0;  ///< freed blocks waiting for other streams' work to finish
};

template <class Policy>
class CachingAllocator {
 public:
  using Stream = typename Policy::Stream;
  using Event = typename Policy::Event;

  /// `cache_limit`: freed blocks beyond this many cached bytes go back to the device at once.
  explicit CachingAllocator(Policy policy = Policy{}, std::size_t cache_limit = std::numeric_limits<std::size_t>::max())
      : policy_(std::move(policy)), cache_limit_(cache_limit) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  /// Returns the cached blocks to the device; blocks still in use are left to their owners.
  ~CachingAllocator() { release_cached(); }

  /// The size class of a request: 512 bytes at least, a power of two, or a multiple of a quarter
  /// of the power of two below it (so at most 25% above the request).
  static std::size_t size_class(std::size_t bytes) noexcept {
    constexpr std::size_t kMin = 512;
    if (bytes <= kMin) return kMin;
    const std::size_t p = std::bit_floor(bytes);
    if (p == bytes) return bytes;
    const std::size_t step = std::max<std::size_t>(p / 4, kMin);
    return (bytes + step - 1) / step * step;
  }

  /// A block of at least `bytes` bytes for work on `stream`. When the device is out of memory,
  /// every cached block is returned to it and the allocation retried once, after calling
  /// `on_out_of_memory` (which may free memory elsewhere, e.g. other logical devices' caches on
  /// the same chip). \throws UnavailableError when it still fails.
  void* allocate(std::size_t bytes, Stream stream = Stream{}) {
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      ++stats_.allocations;
      collect_reached_locked();
      auto it = free_.find(Key{stream, cls});
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= cls;
        ++stats_.cache_hits;
        note_in_use_locked(p, cls, stream);
        return p;
      }
    }
    void* p = policy_.allocate(cls);
    if (!p) {
      {
        std::lock_guard lock(mu_);
        ++stats_.out_of_memory_retries;
      }
      release_cached();
      if (on_out_of_memory_) on_out_of_memory_();
      p = policy_.allocate(cls);
    }
    std::lock_guard lock(mu_);
    if (!p) {
      throw UnavailableError(str_cat("out of memory on ", policy_.describe(), ": cannot allocate ", bytes, " bytes (",
                                     stats_.bytes_in_use,
                                     " bytes are in use by tensors; cached blocks were released and the "
                                     "allocation retried)"));
    }
    ++stats_.device_allocations;
    note_in_use_locked(p, cls, stream);
    return p;
  }

  /// Notes that work enqueued so far on `stream` uses block `p` (see the file comment). Nothing
  /// for the block's own stream, unknown pointers and nullptr.
  void record_stream(const void* p, Stream stream) {
    std::lock_guard lock(mu_);
    auto it = live_.find(const_cast<void*>(p));
    if (it == live_.end() || it->second.stream == stream) return;
    auto& uses = it->second.uses;
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

  /// Returns a block from `allocate` to the cache (or to the device beyond the cache limit).
  /// Unknown pointers and nullptr are ignored.
  void deallocate(void* p) noexcept {
    if (!p) return;
    Block block;
    {
      std::lock_guard lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) return;
      block = std::move(it->second);
      live_.erase(it);
      stats_.bytes_in_use -= block.cls;
      if (stats_.bytes_cached + block.cls <= cache_limit_ && cache_locked(p, block)) return;
      ++stats_.device_frees;
    }
    policy_.free(p, block.cls);
  }

  /// Returns every cached block to the device (held-back blocks once their events are reached).
  void release_cached() noexcept {
    std::map<Key, std::vector<void*>> blocks;
    std::vector<HeldBack> held;
    {
      std::lock_guard lock(mu_);
      blocks.swap(free_);
      held.swap(held_back_);
      for (const auto& [key, list] : blocks) stats_.device_frees += list.size();
      stats_.device_frees += held.size();
      stats_.bytes_cached = 0;
      stats_.blocks_held_back = 0;
    }
    for (auto& h : held) {
      for (auto& e : h.events) {
        policy_.synchronize_event(e);
        policy_.destroy_event(e);
      }
      policy_.free(h.p, h.cls);
    }
    for (const auto& [key, list] : blocks)
      for (void* p : list) policy_.free(p, key.cls);
  }

  /// Called (without the allocator's lock) before the last retry of an allocation that ran out of
  /// memory. Set before first use.
  void set_on_out_of_memory(std::function<void()> fn) { on_out_of_memory_ = std::move(fn); }

  CachingAllocatorStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  /// True when `p` is a block handed out and not yet returned.
  bool owns(const void* p) const {
    std::lock_guard lock(mu_);
    return live_.count(const_cast<void*>(p)) != 0;
  }
  Policy& policy() noexcept { return policy_; }

 private:
  struct Block {
    std::size_t cls = 0;
    Stream stream{};
    std::vector<Stream> uses;  // other streams whose work uses the block
  };
  struct HeldBack {
    void* p;
    std::size_t cls;
    Stream stream;
    std::vector<Event> events;  // one per stream of `uses`, recorded when the block was freed
  };
  struct Key {
    Stream stream;
    std::size_t cls;
    bool operator<(const Key& o) const {
      if (std::less<Stream>{}(stream, o.stream)) return true;
      if (std::less<Stream>{}(o.stream, stream)) return false;
      return cls < o.cls;
    }
  };

  void note_in_use_locked(void* p, std::size_t cls, Stream stream) {
    live_[p] = Block{cls, stream, {}};
    stats_.bytes_in_use += cls;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  }

  // Keeps a freed block for reuse: in its stream's pool, or held back until the other streams'
  // work on it is done. False when there is no memory for the bookkeeping.
  bool cache_locked(void* p, Block& block) noexcept {
    try {
      if (!block.uses.empty()) {
        HeldBack h{p, block.cls, block.stream, {}};
        h.events.reserve(block.uses.size());
        bool recorded = true;
        for (const Stream& s : block.uses) {
          Event e{};
          if (!policy_.record_event(s, e)) {
            recorded = false;
            break;
          }
          h.events.push_back(e);
        }
        if (recorded) {
          held_back_.push_back(std::move(h));
          stats_.bytes_cached += block.cls;
          ++stats_.blocks_held_back;
          return true;
        }
        // No event could be made: wait for those streams instead, then reuse it as usual.
        for (auto& e : h.events) policy_.destroy_event(e);
        for (const Stream& s : block.uses) policy_.synchronize_stream(s);
      }
      free_[Key{block.stream, block.cls}].push_back(p);
      stats_.bytes_cached += block.cls;
      return true;
    } catch (...) {
      return false;  // no memory for the bookkeeping: the caller gives the block back instead
    }
  }

  // Moves held-back blocks whose events are all reached into their streams' pools.
  void collect_reached_locked() {
    for (std::size_t i = 0; i < held_back_.size();) {
      HeldBack& h = held_back_[i];
      const bool reached =
          std::all_of(h.events.begin(), h.events.end(), [&](const Event& e) { return policy_.event_reached(e); });
      if (!reached) {
        ++i;
        continue;
      }
      free_[Key{h.stream, h.cls}].push_back(h.p);
      for (auto& e : h.events) policy_.destroy_event(e);
      --stats_.blocks_held_back;
      held_back_[i] = std::move(held_back_.back());
      held_back_.pop_back();
    }
  }

  Policy policy_;
  const std::size_t cache_limit_;
  std::function<void()> on_out_of_memory_;
  mutable std::mutex mu_;
  std::map<Key, std::vector<void*>> free_;  // (stream, size class) -> cached blocks (LIFO)
  std::vector<HeldBack> held_back_;
  std::unordered_map<void*, Block> live_;  // handed-out block -> its class, stream and uses
  CachingAllocatorStats stats_;
};

}  // namespace mirrored::detail
