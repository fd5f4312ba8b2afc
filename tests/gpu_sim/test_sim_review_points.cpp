// Three behaviours that only a device can show, shown on simulated GPUs: an
// integer division by zero reaches the replica whose kernel found it (not the replica whose
// library wait happened to synchronise that stream next); a fused optimizer step whose launch fails
// after some packs ran changes no parameter and no slot; and PendingCollective::wait() on a GPU
// replica makes the host wait for nothing until the value is read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>
#include "device/simulated/sim_backend.hpp"
#include "device/simulated/sim_runtime.hpp"

#include "gpu_sim/sim_devices.hpp"
#include "harness.hpp"

namespace mirrored::review_points {

using ::testing::HasSubstr;
using testing::kGpu0;
using testing::kGpu1;
using testing::kGpu2;
using testing::message_of;

detail::sim::Backend& sim_backend(const Device& d) {
  detail::sim::Backend* be = detail::simulated_backend(d);
  if (!be) throw std::logic_error("not a simulated GPU: " + d.to_string());
  return *be;
}

// Integer-valued floats: every sum below is exact.
std::vector<float> ramp(int n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((i * 5 + salt * 3) % 13 - 6);
  return v;
}

// Review point 1. GPU:0 and GPU:2 are on different chips: the default all-reduce sums on replica
// 0, which brings replica 1's input over through the host, synchronising GPU:2's stream from
// replica 0's thread. Replica 1's division by zero must surface on replica 1 (naming it), and
// replica 0 must not see it.
TEST(SimulatedGpuReviewPoints, ADivisionByZeroSurfacesOnTheReplicaWhoseKernelFoundIt) {
  MirroredStrategy s({"GPU:0", "GPU:2"});
  const auto devices = s.extended().worker_devices();
  std::mutex mu;
  std::array<std::string, 2> seen;  // the division error each replica saw
  const std::string msg = message_of<InvalidArgumentError>([&] {
    s.run([&] {
      ReplicaContext& ctx = *get_replica_context();
      const int r = ctx.replica_id_in_sync_group();
      const Device& d = devices[static_cast<std::size_t>(r)];
      try {
        Tensor<int32_t> q;
        if (r == 1) {
          q = Tensor<int32_t>::from_vector({7, 8}, {2}, d) / Tensor<int32_t>::from_vector({1, 0}, {2}, d);
        }
        return ctx.all_reduce(ReduceOp::SUM, Tensor<float>::from_vector(ramp(64, r), {64}, d));
      } catch (const InvalidArgumentError& e) {
        std::lock_guard lock(mu);
        seen[static_cast<std::size_t>(r)] = e.what();
        throw;
      }
    });
  });
  EXPECT_THAT(msg, HasSubstr("integer division by zero at element 1"));
  EXPECT_THAT(msg, HasSubstr("GPU:2"));
  EXPECT_THAT(msg, HasSubstr("replica 1"));
  EXPECT_EQ(seen[0], "") << "replica 0 raised replica 1's division by zero";
  EXPECT_EQ(seen[1], msg);
  // Raised once: neither device has it any more, and the strategy works again.
  EXPECT_NO_THROW(detail::backend_for(kGpu2).synchronize());
  EXPECT_NO_THROW(detail::backend_for(kGpu0).synchronize());
  const auto ok = s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    return get_replica_context()->all_reduce(
        ReduceOp::SUM, Tensor<float>::from_vector(ramp(64, r), {64}, devices[static_cast<std::size_t>(r)]));
  });
  const std::vector<float> a = ramp(64, 0), b = ramp(64, 1);
  std::vector<float> want(64);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
  EXPECT_EQ(ok[0].to_vector(), want);
  EXPECT_EQ(ok[1].to_vector(), want);
}

// Review point 1, the error path: a library wait that only lets kernels finish before memory is
// handed back (a failed collective, foreign memory released) must leave the flag for the owner's
// next synchronize instead of swallowing it.
TEST(SimulatedGpuReviewPoints, AWaitThatKeepsFlagsLeavesTheDivisionForTheNextSynchronize) {
  const auto a = Tensor<int32_t>::from_vector({6, 8, 9}, {3}, kGpu2);
  const auto zero = Tensor<int32_t>::from_vector({2, 3, 0}, {3}, kGpu2);
  Tensor<int32_t> q = a / zero;
  auto& be = detail::backend_for(kGpu2);
  EXPECT_NO_THROW(be.wait_keeping_flags(Deadline::after(60)));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { be.synchronize(); }),
              HasSubstr("integer division by zero at element 2"));
  EXPECT_NO_THROW(be.synchronize());  // raised once
}

// Review point 1, a real error path: replica 0 of a same-chip all-reduce fails after launching
// its kernel (its "done" event cannot be recorded) and lets the kernels finish before it rethrows.
// That wait must not swallow the division by zero replica 0's earlier kernel found: it is still
// raised afterwards, once, naming replica 0.
TEST(SimulatedGpuReviewPoints, AFailedCollectiveDoesNotSwallowADivisionByZero) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  ASSERT_EQ(s.extended().cross_device_ops().name(), "ReductionToOneDevice");
  const auto devices = s.extended().worker_devices();
  sim_backend(kGpu0).fail_record_event(1);  // "ready" is recorded, "done" fails
  const std::string msg = message_of<InternalError>([&] {
    s.run([&] {
      ReplicaContext& ctx = *get_replica_context();
      const int r = ctx.replica_id_in_sync_group();
      const Device& d = devices[static_cast<std::size_t>(r)];
      Tensor<int32_t> q;
      if (r == 0) q = Tensor<int32_t>::from_vector({4, 5}, {2}, d) / Tensor<int32_t>::from_vector({0, 1}, {2}, d);
      return ctx.all_reduce(ReduceOp::SUM, Tensor<float>::from_vector(ramp(64, r), {64}, d));
    });
  });
  EXPECT_THAT(msg, HasSubstr("injected failure"));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { detail::backend_for(kGpu0).synchronize(); }),
              HasSubstr("integer division by zero at element 0 on GPU:0 (physical GPU 0), replica 0"));
  EXPECT_NO_THROW(detail::backend_for(kGpu0).synchronize());  // raised once
}

// Review point 2. 49 variables: two packs (48 + 1), then the step count. The second launch fails
// after the first pack ran: every parameter, every slot and the step count stay as they were.
TEST(SimulatedGpuReviewPoints, AFailedPackLeavesEveryParameterAndSlotAsBefore) {
  constexpr int kVars = 49;
  std::vector<Variable<float>> vars;
  std::vector<Tensor<float>> grads;
  for (int k = 0; k < kVars; ++k) {
    vars.emplace_back(Tensor<float>::from_vector(ramp(3 + k % 5, k), {3 + k % 5}, kGpu2));
    grads.push_back(Tensor<float>::from_vector(ramp(3 + k % 5, k + 7), {3 + k % 5}, kGpu2));
  }
  optimizers::Adam<> opt;
  opt.build(vars);
  optimizers::GradsAndVars<float> gv;
  for (int k = 0; k < kVars; ++k)
    gv.emplace_back(grads[static_cast<std::size_t>(k)], vars[static_cast<std::size_t>(k)]);
  opt.apply_gradients(gv);  // slots that are not zeros
  auto snapshot = [&] {
    std::vector<std::vector<float>> all;
    for (auto& v : vars) {
      all.push_back(v.value().to_vector());
      all.push_back(opt.get_slot(v, "m").value().to_vector());
      all.push_back(opt.get_slot(v, "v").value().to_vector());
    }
    return all;
  };
  const auto before = snapshot();
  ASSERT_EQ(opt.iterations(), 1);
  // skip 1: the first pack runs, the second fails to launch (skip 0: the first fails).
  for (int skip : {1, 0}) {
    sim_backend(kGpu2).fail_apply_optimizer(skip);
    const std::string msg = message_of<InternalError>([&] { opt.apply_gradients(gv); });
    EXPECT_THAT(msg, HasSubstr("injected launch failure")) << "skip " << skip;
    EXPECT_THAT(msg, HasSubstr("GPU:2")) << "skip " << skip;
    EXPECT_EQ(snapshot(), before) << "skip " << skip;  // bitwise: the vectors compare every float exactly
    EXPECT_EQ(opt.iterations(), 1) << "skip " << skip;
  }
  // The device is usable, and the next step is the step that failed.
  optimizers::Adam<> ref;
  std::vector<Variable<float>> ref_vars;
  for (int k = 0; k < kVars; ++k)
    ref_vars.emplace_back(Tensor<float>::from_vector(ramp(3 + k % 5, k), {3 + k % 5}, kGpu2));
  ref.build(ref_vars);
  optimizers::GradsAndVars<float> ref_gv;
  for (int k = 0; k < kVars; ++k)
    ref_gv.emplace_back(grads[static_cast<std::size_t>(k)], ref_vars[static_cast<std::size_t>(k)]);
  ref.apply_gradients(ref_gv);
  ref.apply_gradients(ref_gv);
  opt.apply_gradients(gv);
  EXPECT_EQ(opt.iterations(), 2);
  for (int k = 0; k < kVars; ++k)
    EXPECT_EQ(vars[static_cast<std::size_t>(k)].value().to_vector(),
              ref_vars[static_cast<std::size_t>(k)].value().to_vector());
}

// Review point 3. GPU:0 and GPU:1 share a chip (the fused on-chip all-reduce): wait() orders the
// replica's stream after the collective and returns; only reading the value waits for the device.
TEST(SimulatedGpuReviewPoints, WaitDoesNoHostWaitUntilTheValueIsRead) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  const auto devices = s.extended().worker_devices();
  constexpr int kN = 4096;
  std::array<uint64_t, 2> in_wait{}, in_read{};
  std::array<std::vector<float>, 2> got;
  s.run([&] {
    ReplicaContext& ctx = *get_replica_context();
    const int r = ctx.replica_id_in_sync_group();
    const Device& d = devices[static_cast<std::size_t>(r)];
    const Tensor<float> x = Tensor<float>::from_vector(ramp(kN, r), {kN}, d);
    const uint64_t before = transfer_counts(d).host_syncs;
    PendingCollective<Tensor<float>> pending = ctx.all_reduce_async(ReduceOp::SUM, x);
    const Tensor<float> y = pending.wait();
    const uint64_t waited = transfer_counts(d).host_syncs;
    got[static_cast<std::size_t>(r)] = y.to_vector();
    in_wait[static_cast<std::size_t>(r)] = waited - before;
    in_read[static_cast<std::size_t>(r)] = transfer_counts(d).host_syncs - waited;
  });
  const std::vector<float> a = ramp(kN, 0), b = ramp(kN, 1);
  std::vector<float> want(kN);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(in_wait[static_cast<std::size_t>(r)], 0u) << "replica " << r << ": host waits before the value was read";
    EXPECT_GE(in_read[static_cast<std::size_t>(r)], 1u) << "replica " << r << ": reading the value did not wait";
    EXPECT_EQ(got[static_cast<std::size_t>(r)], want) << "replica " << r;
  }
}

}  // namespace mirrored::review_points
