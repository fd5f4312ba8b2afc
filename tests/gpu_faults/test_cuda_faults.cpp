// The CUDA backend's error paths, with CUDA calls made to fail on demand: this executable defines
// cudaHostAlloc, cudaEventCreateWithFlags and cudaStreamQuery itself (the library links the shared
// CUDA runtime, so its calls resolve here) and passes them on to the runtime's unless a test arms
// a failure. Its own executable, because a resource made once per backend (staging slots, the
// division flag, the copy stream) fails only on first use, and because the last test leaves
// GPU 0 refused for the rest of the process. Skips without a GPU, except the checks that need
// none (they run in every CUDA build).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mirrored/config.hpp>

#if MIRRORED_HAVE_CUDA

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "device/gpu/gpu_backend.hpp"
#include "device/gpu/gpu_runtime.hpp"

#include "harness.hpp"

namespace {

// Countdowns: k > 0 makes the k-th next call fail.
std::atomic<int> g_fail_host_alloc{0};
std::atomic<int> g_fail_event_create{0};
std::atomic<int> g_sticky_stream_query{0};

bool fire(std::atomic<int>& countdown) {
  int k = countdown.load();
  while (k > 0 && !countdown.compare_exchange_weak(k, k - 1)) {
  }
  return k == 1;
}

template <class Fn>
Fn real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) std::abort();  // the CUDA runtime must be a shared library for these tests
  return reinterpret_cast<Fn>(f);
}

}  // namespace

extern "C" cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  static const auto next = real<cudaError_t (*)(void**, size_t, unsigned int)>("cudaHostAlloc");
  if (fire(g_fail_host_alloc)) return cudaErrorMemoryAllocation;
  return next(ptr, size, flags);
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  static const auto next = real<cudaError_t (*)(cudaEvent_t*, unsigned int)>("cudaEventCreateWithFlags");
  if (fire(g_fail_event_create)) return cudaErrorMemoryAllocation;
  return next(event, flags);
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t stream) {
  static const auto next = real<cudaError_t (*)(cudaStream_t)>("cudaStreamQuery");
  if (fire(g_sticky_stream_query)) return cudaErrorIllegalAddress;
  return next(stream);
}

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::message_of;

const Device kGpu0(DeviceType::GPU, 0);

class CudaFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(detail::gpu_runtime().name()) != "CUDA" || list_logical_devices(DeviceType::GPU).empty())
      GTEST_SKIP() << "needs a CUDA GPU (" << detail::gpu_runtime().name() << " runtime, "
                   << list_logical_devices(DeviceType::GPU).size() << " GPUs)";
  }
  void TearDown() override {
    g_fail_host_alloc = 0;
    g_fail_event_create = 0;
    g_sticky_stream_query = 0;
  }
};

std::vector<unsigned char> pattern(std::size_t bytes, int seed) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(seed));
  return v;
}

// Item 8: the third of four pinned staging slots cannot be allocated. The copy fails; the next
// one makes all four slots again and works (half-made slots were once published, and the next
// copy past slot 1 wrote through a null pointer).
TEST_F(CudaFaults, StagingSlotsAreMadeAllOrNothing) {
  auto& be = detail::backend_for(kGpu0);
  constexpr std::size_t kBytes = (std::size_t{9} << 20) + 5;  // more than two 4 MiB slots
  const auto src = pattern(kBytes, 1);
  void* dev = be.allocate(kBytes);
  g_fail_host_alloc = 3;
  EXPECT_THROW(be.copy_from_host(dev, src.data(), kBytes), UnavailableError);
  EXPECT_EQ(g_fail_host_alloc.load(), 0) << "the staging slots were made before this test";
  be.copy_from_host(dev, src.data(), kBytes);
  std::vector<unsigned char> back(kBytes);
  be.synchronize();
  be.copy_to_host(back.data(), dev, kBytes);
  EXPECT_TRUE(back == src);
  be.deallocate(dev, kBytes);
}

// Item 8: the integer-division flag's pinned host word cannot be allocated. The division fails;
// the next one makes both buffers and reports a zero divisor as usual.
TEST_F(CudaFaults, TheDivisionFlagIsMadeAllOrNothing) {
  const auto a = Tensor<int32_t>::from_vector({6, 8, 9}, {3}, kGpu0);
  const auto b = Tensor<int32_t>::from_vector({2, 4, 3}, {3}, kGpu0);
  const auto zero = Tensor<int32_t>::from_vector({2, 0, 3}, {3}, kGpu0);
  (void)a.to_vector();  // staging made, everything settled
  g_fail_host_alloc = 1;
  EXPECT_THROW((void)(a / b), UnavailableError);
  EXPECT_EQ((a / b).to_vector(), (std::vector<int32_t>{3, 2, 3}));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)(a / zero).to_vector(); }),
              HasSubstr("division by zero at element 1"));
}

// Item 8: the prefetch lane's ordering event cannot be made. The prefetch fails; the next one
// makes the stream and its event together and copies the data.
TEST_F(CudaFaults, ThePrefetchStreamIsMadeWithItsEvent) {
  auto& be = detail::backend_for(kGpu0);
  const auto src = pattern(4096, 2);
  void* dev = be.allocate(src.size());
  g_fail_event_create = 1;
  EXPECT_THROW(be.prefetch_from_host(dev, src.data(), src.size()), UnavailableError);
  be.prefetch_from_host(dev, src.data(), src.size());
  std::vector<unsigned char> back(src.size());
  be.copy_to_host(back.data(), dev, src.size());  // prefetch is complete on return
  EXPECT_TRUE(back == src);
  be.deallocate(dev, src.size());
}

// Item 11: synchronize has a deadline (the stream is busy with a 2 s host function).
TEST_F(CudaFaults, SynchronizeHasADeadline) {
  auto& be = detail::cuda_backend(kGpu0);
  ASSERT_EQ(cudaLaunchHostFunc(
                be.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(2)); }, nullptr),
            cudaSuccess);
  const std::string msg = message_of<DeadlineExceededError>([&] { be.synchronize_until(Deadline::after(0.2)); });
  EXPECT_THAT(msg, HasSubstr("GPU:0 (physical GPU 0)"));
  EXPECT_THAT(msg, HasSubstr("within 0.2 s"));
  be.synchronize();
}

// Item 11: a sticky error (here reported by cudaStreamQuery) fails the call that meets it and
// makes the device refuse all later work, the strategy's included. Last in this executable: GPU 0
// stays refused in this process.
TEST_F(CudaFaults, ZZAStickyErrorMakesTheStrategyRefuseWork) {
  MirroredStrategy s({"GPU:0"});
  const auto t = Tensor<float>::full({16}, 1.0f, kGpu0);
  g_sticky_stream_query = 1;
  const std::string first = message_of<InternalError>([&] { (void)t.to_vector(); });
  EXPECT_THAT(first, HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THAT(first, HasSubstr("sticky"));
  const std::string later = message_of<FailedPreconditionError>([&] { s.run([] { return 1; }); });
  EXPECT_THAT(later, HasSubstr("GPU:0 (physical GPU 0)"));
  EXPECT_THAT(later, HasSubstr("must be reset"));
  EXPECT_THAT(later, HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THROW((void)Tensor<float>::zeros({1}, kGpu0), FailedPreconditionError);
}

// No GPU needed: the classification, and the refusal bookkeeping (on a physical GPU index no
// machine has, so that no other test is affected).
TEST(CudaErrors, StickyErrorsMakeTheirGpuRefuseWork) {
  EXPECT_TRUE(detail::cuda_error_is_sticky(cudaErrorIllegalAddress));
  EXPECT_TRUE(detail::cuda_error_is_sticky(cudaErrorLaunchFailure));
  EXPECT_FALSE(detail::cuda_error_is_sticky(cudaErrorMemoryAllocation));
  EXPECT_FALSE(detail::cuda_error_is_sticky(cudaErrorInvalidValue));
  const Device far(DeviceType::GPU, 63);
  EXPECT_THAT(
      message_of<InternalError>([&] { detail::throw_cuda_error(cudaErrorInvalidValue, "cudaMemcpy", far, 62); }),
      HasSubstr("cudaErrorInvalidValue"));
  EXPECT_NO_THROW(detail::check_gpu_usable(far, 62));
  const std::string first = message_of<InternalError>(
      [&] { detail::throw_cuda_error(cudaErrorIllegalAddress, "sum_n kernel launch", far, 63); });
  EXPECT_THAT(first, HasSubstr("sum_n kernel launch failed on GPU:63 (physical GPU 63)"));
  EXPECT_THAT(first, HasSubstr("sticky"));
  const std::string later = message_of<FailedPreconditionError>([&] { detail::check_gpu_usable(far, 63); });
  EXPECT_THAT(later, HasSubstr("cudaErrorIllegalAddress"));
  EXPECT_THAT(later, HasSubstr("must be reset"));
}

// Item 10: NCCL_RUNTIME_CONNECT is set while the library loads, before any thread, not by the
// first collective (setenv there raced with getenv on other threads).
TEST(NcclEnvironment, RuntimeConnectIsSetBeforeAnyCollective) {
  if (!detail::nccl_compiled_in()) GTEST_SKIP() << "this build has no NCCL";
  // "0" unless whoever started the test set it (a user's setting wins).
  EXPECT_NE(std::getenv("NCCL_RUNTIME_CONNECT"), nullptr);
}

}  // namespace
}  // namespace mirrored

#else  // !MIRRORED_HAVE_CUDA

TEST(CudaFaults, NeedsACudaBuild) { GTEST_SKIP() << "this build of mirrored has no CUDA"; }

#endif
