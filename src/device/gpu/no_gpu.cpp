// The GPU runtime of a build without CUDA: no GPUs, so every GPU device is "not found" and the
// core never asks for more.
#include "device/gpu/gpu_runtime.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {
namespace {

class NoGpuRuntime final : public GpuRuntime {
 public:
  const char* name() const noexcept override { return "none"; }
  int physical_gpu_count() const noexcept override { return 0; }
  std::string unavailable_reason() const override { return "this build of mirrored has no CUDA support"; }
  bool drives_physical_gpus() const noexcept override { return false; }
  GpuBackend& backend(const Device& device) override {
    throw NotFoundError("Device " + device.to_string() + " not found: " + unavailable_reason());
  }
  void enter_device(const Device&) override {}
  bool copy_gpu_to_gpu(void*, const Device&, const void*, const Device&, std::size_t) override { return false; }
};

}  // namespace

std::unique_ptr<GpuRuntime> make_platform_gpu_runtime() { return std::make_unique<NoGpuRuntime>(); }

}  // namespace mirrored::detail
