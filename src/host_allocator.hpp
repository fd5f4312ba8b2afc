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

}  // namespace mirrored::detail
