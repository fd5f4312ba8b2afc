#pragma once
// Private: the bookkeeping of the per-device caching allocator, independent of CUDA so that it is
// tested on any machine (tests/test_caching_allocator.cpp drives it with a fake policy).
//
// Blocks are rounded up to size classes (at most 25% larger than asked for, 512 bytes minimum)
// and freed blocks are kept per class for reuse, so a training loop that allocates the same
// tensors every step stops calling the device allocator after its first step. The allocator is
// meant for one stream: a block freed while work on that stream may still use it can be handed
// out again at once, because every later use is ordered after that work on the same stream
// (like PyTorch's caching allocator).
//
// Policy (copied in): `void* allocate(std::size_t bytes)` returns nullptr when the device is out
// of memory and throws a mirrored error for anything else; `void free(void* p, std::size_t bytes)
// noexcept`; `std::string describe() const` names the device for messages.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
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
  std::size_t bytes_cached = 0;  ///< size-class bytes kept for reuse
  std::size_t peak_bytes_in_use = 0;
};

template <class Policy>
class CachingAllocator {
 public:
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

  /// A block of at least `bytes` bytes. When the device is out of memory, every cached block is
  /// returned to it and the allocation retried once, after calling `on_out_of_memory` (which may
  /// free memory elsewhere, e.g. other logical devices' caches on the same chip).
  /// \throws UnavailableError when it still fails.
  void* allocate(std::size_t bytes) {
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      ++stats_.allocations;
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= cls;
        ++stats_.cache_hits;
        note_in_use_locked(p, cls);
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
    note_in_use_locked(p, cls);
    return p;
  }

  /// Returns a block from `allocate` to the cache (or to the device beyond the cache limit).
  /// Unknown pointers and nullptr are ignored.
  void deallocate(void* p) noexcept {
    if (!p) return;
    std::size_t cls = 0;
    {
      std::lock_guard lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) return;
      cls = it->second;
      live_.erase(it);
      stats_.bytes_in_use -= cls;
      if (stats_.bytes_cached + cls <= cache_limit_) {
        try {
          free_[cls].push_back(p);
          stats_.bytes_cached += cls;
          return;
        } catch (...) {
          // No memory for the bookkeeping: give the block back instead.
        }
      }
      ++stats_.device_frees;
    }
    policy_.free(p, cls);
  }

  /// Returns every cached block to the device.
  void release_cached() noexcept {
    std::unordered_map<std::size_t, std::vector<void*>> blocks;
    {
      std::lock_guard lock(mu_);
      blocks.swap(free_);
      for (const auto& [cls, list] : blocks) stats_.device_frees += list.size();
      stats_.bytes_cached = 0;
    }
    for (const auto& [cls, list] : blocks)
      for (void* p : list) policy_.free(p, cls);
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
  void note_in_use_locked(void* p, std::size_t cls) {
    live_[p] = cls;
    stats_.bytes_in_use += cls;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  }

  Policy policy_;
  const std::size_t cache_limit_;
  std::function<void()> on_out_of_memory_;
  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks (LIFO)
  std::unordered_map<void*, std::size_t> live_;               // handed-out block -> size class
  CachingAllocatorStats stats_;
};

}  // namespace mirrored::detail
