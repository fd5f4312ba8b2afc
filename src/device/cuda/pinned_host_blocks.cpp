// Pinning of the host allocator's large blocks for direct host-to-device DMA (the input
// pipeline's prefetch). A block is registered with the driver the first time a copy reads from
// it and stays registered while the host cache recycles it, so a steady-state pipeline pins each
// of its few batch buffers once; the host allocator's release hook unregisters a block just
// before it goes back to the system.
#include <map>
#include <mutex>

#include "device/cuda/cuda_backend.hpp"
#include "device/host/host_allocator.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

struct PinnedBlocks {
  std::mutex mu;
  std::map<void*, std::size_t> blocks;  // registered base -> size
  bool warned = false;
};
PinnedBlocks& pinned_blocks() {
  static PinnedBlocks* p = new PinnedBlocks;  // used by the host cache's release at exit
  return *p;
}

void unpin_before_release(void* base, std::size_t) noexcept {
  auto& p = pinned_blocks();
  std::lock_guard lock(p.mu);
  if (p.blocks.erase(base) == 0) return;
  // At process exit the runtime may already be gone; the memory is freed either way.
  if (cudaHostUnregister(base) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace

bool pin_host_block(const void* ptr, const Device& logical, int physical) {
  static std::once_flag hook_once;
  std::call_once(hook_once, [] { set_host_block_release_hook(&unpin_before_release); });
  const HostBlock block = host_block_containing(ptr);
  if (!block.base) return false;
  auto& p = pinned_blocks();
  std::lock_guard lock(p.mu);
  if (p.blocks.count(block.base)) return true;
  const cudaError_t err = cudaHostRegister(block.base, block.size, cudaHostRegisterPortable);
  if (err == cudaSuccess || err == cudaErrorHostMemoryAlreadyRegistered) {
    if (err != cudaSuccess) (void)cudaGetLastError();
    p.blocks.emplace(block.base, block.size);
    return true;
  }
  (void)cudaGetLastError();
  if (!p.warned) {
    p.warned = true;
    MIRRORED_LOG(warn, "cudaHostRegister of a ", block.size, "-byte host block failed on ",
                 describe_gpu_call_site(logical, physical), ": ", cudaGetErrorString(err),
                 "; input copies to GPUs are staged through pinned buffers instead");
  }
  return false;
}

}  // namespace mirrored::detail
