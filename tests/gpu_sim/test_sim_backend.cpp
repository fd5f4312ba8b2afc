// The simulated GPU through the library (MIRRORED_SIMULATED_GPUS, set by sim_environment.cpp):
// what it is (not host memory, no NCCL), that it keeps only DeviceBackend's documented guarantees
// (a host read without synchronize() reads stale memory), streams and events, deadlines, and the
// failure paths a real GPU cannot be made to show on demand: a failed same-chip all-reduce and a
// sticky device error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "device/gpu/logical_gpus.hpp"
#include "device/simulated/sim_backend.hpp"
#include "device/simulated/sim_runtime.hpp"

#include "gpu_sim/sim_devices.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using detail::DeviceBackend;
using detail::StreamKind;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::message_of;

using testing::kGpu0;
using testing::kGpu1;
using testing::kGpu2;
using testing::kGpu3;

detail::sim::Backend& sim(const Device& d) {
  detail::sim::Backend* be = detail::simulated_backend(d);
  if (!be) throw std::logic_error("not a simulated GPU: " + d.to_string());
  return *be;
}

// Reads `t`'s device memory the way host code must not: without synchronize().
template <class T>
std::vector<T> read_without_sync(const Tensor<T>& t) {
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  detail::backend_for(t.device()).copy_to_host(out.data(), t.data(), t.bytes());
  return out;
}

TEST(SimulatedGpu, IsTheProcesssGpuRuntime) {
  auto& rt = detail::gpu_runtime();
  EXPECT_STREQ(rt.name(), "simulated");
  EXPECT_EQ(rt.physical_gpu_count(), 3);
  EXPECT_FALSE(rt.drives_physical_gpus());
  EXPECT_EQ(list_logical_devices(DeviceType::GPU).size(), 4u);
  EXPECT_EQ(detail::logical_gpu_location(1), std::make_pair(0, 1));
  EXPECT_EQ(detail::logical_gpu_location(2), std::make_pair(1, 0));
  EXPECT_FALSE(kGpu0.is_host());
}

TEST(SimulatedGpu, CountIsValidated) {
  EXPECT_EQ(detail::parse_simulated_gpu_count("4"), 4);
  EXPECT_EQ(detail::parse_simulated_gpu_count("64"), 64);
  for (const char* bad : {"0", "65", "-1", "two", "1.5", " 2", ""}) {
    const std::string msg = message_of<InvalidArgumentError>([&] { detail::parse_simulated_gpu_count(bad); });
    EXPECT_THAT(msg, HasSubstr("MIRRORED_SIMULATED_GPUS must be a whole number")) << bad;
    EXPECT_THAT(msg, HasSubstr(std::string("got '") + bad + "'"));
  }
}

// No NCCL for simulated GPUs: the default for distinct physical GPUs is the reduce-to-one-device
// path, and logical GPUs of one chip take it too.
TEST(SimulatedGpu, DefaultOpsNeverPickNccl) {
  EXPECT_EQ(MirroredStrategy({"GPU:0", "GPU:2"}).extended().cross_device_ops().name(), "ReductionToOneDevice");
  EXPECT_EQ(MirroredStrategy({"GPU:0", "GPU:1"}).extended().cross_device_ops().name(), "ReductionToOneDevice");
  EXPECT_EQ(MirroredStrategy({"GPU:2"}).extended().cross_device_ops().name(), "ReductionToOneDevice");
}

TEST(SimulatedGpu, ExplicitNcclRefusesSimulatedGpus) {
  MirroredStrategy s({"GPU:0", "GPU:2"}, std::make_shared<NcclAllReduce>());
  const auto devices = s.extended().worker_devices();
  auto run = [&] {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({4}, 1, devices[r]));
    });
  };
  if (detail::nccl_compiled_in()) {
    EXPECT_THAT(message_of<FailedPreconditionError>(run), HasSubstr("simulated"));
  } else {
    EXPECT_THROW(run(), UnimplementedError);
  }
}

// copy_to_host is complete on return and reads device memory at once: it is not ordered after
// queued work. Without the synchronize() the contract asks for, the host sees memory as it was.
TEST(SimulatedGpu, AHostReadWithoutSynchronizeSeesStaleMemory) {
  auto& stream = sim(kGpu0).stream(StreamKind::compute);
  auto t = Tensor<int32_t>::full({1000}, 7, kGpu0);
  t.to_vector();  // settled: 7s
  stream.hold();  // the device runs nothing until release, so the outcome is certain
  auto& be = detail::backend_for(kGpu0);
  const int32_t nine = 9;
  be.fill(DType::int32, t.data(), t.numel(), &nine);
  const auto stale = read_without_sync(t);
  stream.release();
  EXPECT_EQ(stale, std::vector<int32_t>(1000, 7)) << "the fill had not run: the host read old memory";
  EXPECT_EQ(t.to_vector(), std::vector<int32_t>(1000, 9)) << "to_vector synchronizes first";

  // Memory nobody wrote holds a poison pattern (0xA5 bytes), written in stream order.
  const auto fresh = Tensor<int32_t>::empty({4}, kGpu0);
  int32_t expected;
  std::memset(&expected, 0xA5, sizeof expected);
  EXPECT_EQ(fresh.to_vector(), std::vector<int32_t>(4, expected));
}

TEST(SimulatedGpu, HostMemoryIsReadBeforeACopyReturns) {
  std::vector<float> src = {1, 2, 3, 4};
  auto& stream = sim(kGpu0).stream(StreamKind::compute);
  stream.hold();
  const auto t = Tensor<float>::from_vector(src, {4}, kGpu0);
  src.assign(4, -1.0f);  // the caller may reuse its buffer at once
  stream.release();
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(SimulatedGpu, SynchronizeHasADeadline) {
  auto& be = detail::backend_for(kGpu2);
  auto& stream = sim(kGpu2).stream(StreamKind::compute);
  const auto t = Tensor<float>::zeros({8}, kGpu2);
  stream.hold();
  const auto u = t + 1.0f;
  const std::string msg = message_of<DeadlineExceededError>([&] { be.synchronize_until(Deadline::after(0.05)); });
  stream.release();
  EXPECT_THAT(msg, HasSubstr("GPU:2 (physical GPU 1)"));
  EXPECT_THAT(msg, HasSubstr("0.05 s"));
  EXPECT_EQ(u.to_vector(), std::vector<float>(8, 1.0f));
}

// Events order the streams of two logical GPUs of one chip, whose kernels read each other's memory.
TEST(SimulatedGpu, EventsOrderTheStreamsOfTwoLogicalGpus) {
  auto& be0 = detail::backend_for(kGpu0);
  auto& be1 = detail::backend_for(kGpu1);
  auto x = Tensor<int64_t>::zeros({4096}, kGpu0);
  auto y = Tensor<int64_t>::zeros({4096}, kGpu1);
  x.to_vector();
  y.to_vector();
  auto ready = be0.create_event();
  sim(kGpu0).delay_next(StreamKind::compute, 100ms);
  const int64_t five = 5;
  be0.fill(DType::int64, x.data(), x.numel(), &five);
  be0.record_event(*ready);
  EXPECT_FALSE(ready->query());
  be1.wait_event(*ready);
  be1.copy_within(y.data(), x.data(), x.bytes());  // GPU:1 reads GPU:0's memory: same chip
  EXPECT_EQ(y.to_vector(), std::vector<int64_t>(4096, 5));
  EXPECT_TRUE(ready->query());
}

// The communication stream runs beside the compute stream; events order them.
TEST(SimulatedGpu, TheCommunicationStreamIsASecondStream) {
  auto& be = detail::backend_for(kGpu2);
  auto& compute = sim(kGpu2).stream(StreamKind::compute);
  const auto a = Tensor<float>::zeros({256}, kGpu2);
  a.to_vector();
  compute.hold();
  const auto pending = a + 1.0f;  // compute-stream work that cannot run while held
  Tensor<float> b;
  {
    DeviceBackend::StreamScope on_comm(be, StreamKind::communication);
    EXPECT_EQ(be.current_stream(), StreamKind::communication);
    b = Tensor<float>::full({256}, 3.0f, kGpu2);
    be.synchronize();  // the communication stream's work: done while the compute stream is held
  }
  EXPECT_EQ(be.current_stream(), StreamKind::compute);
  EXPECT_FALSE(compute.reached(compute.last_ticket()));
  compute.release();
  // b belongs to the communication stream; compute work on it waits for that stream's event.
  auto done = be.create_event();
  {
    DeviceBackend::StreamScope on_comm(be, StreamKind::communication);
    be.record_event(*done);
  }
  be.wait_event(*done);
  const auto c = pending + b;
  EXPECT_EQ(c.to_vector(), std::vector<float>(256, 4.0f));
}

TEST(SimulatedGpu, OutOfMemoryIsTyped) {
  const std::string msg = message_of<UnavailableError>([&] { (void)Tensor<float>::empty({int64_t{1} << 40}, kGpu1); });
  EXPECT_THAT(msg, HasSubstr("out of memory on GPU:1 (physical GPU 0)"));
}

// Replica 0 of a same-chip all-reduce fails after its stream was given the fused kernel but
// before it recorded "done"; replica 1 leaves at once. Its freed buffers must not be handed out
// again while replica 0's kernel may still write them.
TEST(SimulatedGpu, AFailedOnChipAllReduceReusesNoBufferItsKernelWrites) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  ASSERT_EQ(s.extended().cross_device_ops().name(), "ReductionToOneDevice");
  const auto devices = s.extended().worker_devices();
  constexpr int64_t kN = 1 << 14;
  auto& b0 = sim(kGpu0);
  b0.fail_record_event(1);                    // "ready" is recorded, "done" fails
  b0.delay_next(StreamKind::compute, 300ms);  // replica 0's stream runs late
  const std::string msg = message_of<InternalError>([&] {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({kN}, float(r + 1), devices[r]));
    });
  });
  EXPECT_THAT(msg, HasSubstr("injected failure"));
  std::vector<Tensor<float>> fresh;  // on GPU:1's stream, from blocks replica 1 freed
  for (int i = 0; i < 4; ++i) fresh.push_back(Tensor<float>::full({kN}, 7.0f, kGpu1));
  detail::backend_for(kGpu0).synchronize();  // replica 0's kernel has run by now in any case
  for (const auto& t : fresh) EXPECT_EQ(t.to_vector(), std::vector<float>(kN, 7.0f));
  // The strategy is usable again.
  auto ok = s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({kN}, float(r + 1), devices[r]));
  });
  EXPECT_EQ(ok[1].to_vector(), std::vector<float>(kN, 3.0f));
}

// A sticky device error (CUDA's illegal address and kin): the call that meets it fails, and the
// device refuses all later work, the strategy's included, saying it must be reset. GPU:3 is used
// by this test alone.
TEST(SimulatedGpu, AStickyErrorMakesTheDeviceRefuseWork) {
  const auto t = Tensor<float>::full({4}, 1.0f, kGpu3);
  sim(kGpu3).inject_fault("simulated illegal memory access");
  const std::string first = message_of<InternalError>([&] { (void)t.to_vector(); });
  EXPECT_THAT(first, HasSubstr("simulated illegal memory access"));
  EXPECT_THAT(first, HasSubstr("sticky"));
  EXPECT_THAT(first, HasSubstr("must be reset"));
  const std::string later = message_of<FailedPreconditionError>([&] {
    MirroredStrategy s({"GPU:3"});
    s.run([] { return 1; });
  });
  EXPECT_THAT(later, HasSubstr("GPU:3 (physical GPU 2)"));
  EXPECT_THAT(later, HasSubstr("must be reset"));
  EXPECT_THAT(later, HasSubstr("simulated illegal memory access"));
  EXPECT_THROW((void)Tensor<float>::zeros({1}, kGpu3), FailedPreconditionError);
  // Other GPUs are unaffected.
  EXPECT_EQ(Tensor<float>::full({2}, 2.0f, kGpu2).to_vector(), std::vector<float>(2, 2.0f));
}

}  // namespace
}  // namespace mirrored
