#include "device/host/host_allocator.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

constexpr std::size_t kSmallAlignment = 64;
constexpr std::size_t kLargeThreshold = std::size_t{1} << 20;  // 1 MiB
constexpr std::size_t kLargeAlignment = std::size_t{2} << 20;  // huge-page aligned

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

std::atomic<void (*)(void*, std::size_t) noexcept> release_hook{nullptr};

void free_large(void* p, std::size_t rounded) noexcept {
  if (auto hook = release_hook.load(std::memory_order_acquire)) hook(p, rounded);
  std::free(p);
}

class LargeBlockCache {
 public:
  LargeBlockCache()
      : limit_(static_cast<std::size_t>(env_non_negative("MIRRORED_HOST_CACHE_MB", 2048.0) * (1 << 20))),
        huge_pages_(env_non_negative("MIRRORED_HOST_HUGE_PAGES", 0.0) != 0.0) {}
  ~LargeBlockCache() { release(); }

  void* take(std::size_t rounded) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        void* p = it->second;
        live_.emplace(p, rounded);  // first: when it throws, the block stays cached
        free_.erase(it);
        cached_ -= rounded;
        return p;
      }
    }
    void* p = std::aligned_alloc(kLargeAlignment, rounded);
    if (!p) {
      release();  // give cached blocks back and try once more
      p = std::aligned_alloc(kLargeAlignment, rounded);
    }
    if (!p) throw UnavailableError("host allocation of " + std::to_string(rounded) + " bytes failed");
    MIRRORED_LOG(debug, "host allocator: new ", rounded, "-byte block (", cached(), " bytes cached)");
#ifdef MADV_HUGEPAGE
    // Opt-in (MIRRORED_HOST_HUGE_PAGES=1), like PyTorch's THP_MEM_ALLOC_ENABLE: huge pages mean fewer
    // page faults, but on a VM whose host backs them with small pages every stream through them got
    // slower: an Adam update over 25 MB took 33 ns per element instead of 4 (docs/performance.md).
    if (huge_pages_) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
    try {
      std::lock_guard lock(mu_);
      live_.emplace(p, rounded);
    } catch (...) {
      std::free(p);
      throw;
    }
    return p;
  }

  void give_back(void* p, std::size_t rounded) noexcept {
    {
      std::lock_guard lock(mu_);
      live_.erase(p);
      if (cached_ + rounded <= limit_) {
        free_.emplace(rounded, p);
        cached_ += rounded;
        return;
      }
    }
    MIRRORED_LOG(debug, "host allocator: freeing a ", rounded, "-byte block (the cache holds ", limit_,
                 " bytes at most, MIRRORED_HOST_CACHE_MB)");
    free_large(p, rounded);
  }

  HostBlock containing(const void* p) noexcept {
    std::lock_guard lock(mu_);
    auto it = live_.upper_bound(const_cast<void*>(p));
    if (it == live_.begin()) return {};
    --it;
    const auto* base = static_cast<const unsigned char*>(it->first);
    if (static_cast<const unsigned char*>(p) >= base + it->second) return {};
    return {it->first, it->second};
  }

  std::size_t cached() noexcept {
    std::lock_guard lock(mu_);
    return cached_;
  }

  void release() noexcept {
    std::multimap<std::size_t, void*> blocks;
    {
      std::lock_guard lock(mu_);
      blocks.swap(free_);
      cached_ = 0;
    }
    for (auto& [size, p] : blocks) free_large(p, size);
  }

 private:
  std::mutex mu_;
  std::multimap<std::size_t, void*> free_;  // exact rounded size → block
  std::map<void*, std::size_t> live_;       // handed-out block → rounded size
  std::size_t cached_ = 0;
  const std::size_t limit_;
  const bool huge_pages_;  // madvise(MADV_HUGEPAGE) on new blocks
};

LargeBlockCache& cache() {
  static LargeBlockCache c;
  return c;
}

}  // namespace

void* host_allocate(std::size_t bytes) {
  if (bytes >= kLargeThreshold) return cache().take(round_up(bytes, kLargeAlignment));
  void* p = std::aligned_alloc(kSmallAlignment, round_up(bytes, kSmallAlignment));
  if (!p) throw UnavailableError("host allocation of " + std::to_string(bytes) + " bytes failed");
  return p;
}

void host_deallocate(void* ptr, std::size_t bytes) noexcept {
  if (!ptr) return;
  if (bytes >= kLargeThreshold)
    cache().give_back(ptr, round_up(bytes, kLargeAlignment));
  else
    std::free(ptr);
}

std::size_t host_cached_bytes() noexcept { return cache().cached(); }
HostBlock host_block_containing(const void* p) noexcept { return cache().containing(p); }
void set_host_block_release_hook(void (*hook)(void*, std::size_t) noexcept) noexcept {
  release_hook.store(hook, std::memory_order_release);
}
void host_release_cached() noexcept { cache().release(); }

}  // namespace mirrored::detail
