#pragma once
// Private: host memory for tensors. Large blocks are cached and reused, like a caching device
// allocator: a fresh 64 MiB mapping costs tens of milliseconds in page faults, which would
// dominate every large all-reduce (each returns a new tensor).
#include <cstddef>

namespace mirrored::detail {

/// 64-byte aligned host memory; blocks of at least 1 MiB come from (and return to) a cache.
void* host_allocate(std::size_t bytes);
/// Returns memory from `host_allocate` of the same `bytes`.
void host_deallocate(void* ptr, std::size_t bytes) noexcept;
/// Bytes currently held in the cache (not in use by any tensor).
std::size_t host_cached_bytes() noexcept;
/// Frees every cached block.
void host_release_cached() noexcept;

/// A block of the large-block cache that is handed out: its start and size.
struct HostBlock {
  void* base = nullptr;
  std::size_t size = 0;
};
/// The handed-out large block (>= 1 MiB) holding `p`, or an empty block when `p` is in none
/// (small allocations, memory not from host_allocate). Lets a device pin the whole block once
/// and keep it pinned while the cache recycles it.
HostBlock host_block_containing(const void* p) noexcept;
/// Called with each large block just before it goes back to the system (never while it is in
/// use or cached), e.g. to unpin it. Set once, before blocks are pinned.
void set_host_block_release_hook(void (*hook)(void* base, std::size_t size) noexcept) noexcept;

}  // namespace mirrored::detail
