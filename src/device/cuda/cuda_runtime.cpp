// The CUDA GPU runtime: physical GPU discovery through the CUDA runtime, the CUDA backends, and the
// platform operations the core asks for. Any runtime error at discovery (no driver, no device,
// insufficient driver) means zero GPUs: discovery never throws.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "device/cuda/cuda_backend.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "device/gpu/logical_gpus.hpp"

namespace mirrored::detail {
namespace {

void enable_peer_access(const CudaBackend& to, const CudaBackend& from) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, bool> tried;
  std::lock_guard lock(mu);
  for (const auto& [a, b] : {std::pair{to.physical(), from.physical()}, std::pair{from.physical(), to.physical()}}) {
    if (!tried.emplace(std::pair{a, b}, true).second) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
      (void)cudaGetLastError();
      continue;
    }
    CudaDeviceGuard guard(a, std::nothrow);
    const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
    if (err != cudaSuccess) (void)cudaGetLastError();  // already enabled, or not possible: copies still work
  }
}

class CudaGpuRuntime final : public GpuRuntime {
 public:
  CudaGpuRuntime() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      reason_ = std::string("the CUDA runtime reports ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
      (void)cudaGetLastError();  // clear the error so later calls start clean
      return;
    }
    count_ = n;
    if (n == 0) reason_ = "the CUDA runtime reports no devices";
  }

  const char* name() const noexcept override { return "CUDA"; }
  int physical_gpu_count() const noexcept override { return count_; }
  std::string unavailable_reason() const override {
    return reason_.empty() ? std::to_string(count_) + " visible" : reason_;
  }

  CudaBackend& backend(const Device& device) override { return cuda_backend(device.index()); }
  bool drives_physical_gpus() const noexcept override { return true; }

  void enter_device(const Device& device) override {
    const int physical = logical_gpu_location(device.index()).first;
    // After a sticky error the device's context is gone: refuse the run up front.
    check_gpu_usable(device, physical);
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == physical) return;
    const cudaError_t err = cudaSetDevice(physical);
    if (err != cudaSuccess) throw_cuda_error(err, "cudaSetDevice", device, physical);
  }

  bool copy_gpu_to_gpu(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                       std::size_t bytes) override {
    CudaBackend& to = cuda_backend(dst_device);
    CudaBackend& from = cuda_backend(src_device);
    from.synchronize();  // the source's contents are final
    CudaDeviceGuard guard(to.physical(), to.device());
    const cudaStream_t stream = to.stream_for_call();
    if (to.physical() == from.physical()) {
      to.check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    } else {
      enable_peer_access(to, from);
      to.check(cudaMemcpyPeerAsync(dst, to.physical(), src, from.physical(), bytes, stream), "cudaMemcpyPeerAsync");
    }
    to.synchronize();  // complete on return, like every copy_between
    return true;
  }

 private:
  int count_ = 0;
  std::string reason_;
};

}  // namespace

std::unique_ptr<GpuRuntime> make_platform_gpu_runtime() { return std::make_unique<CudaGpuRuntime>(); }

}  // namespace mirrored::detail
