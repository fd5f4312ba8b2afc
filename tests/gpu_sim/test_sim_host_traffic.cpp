// What crosses between the host and a simulated GPU: the per-backend counters of host<->device
// bytes and host waits, and the hot paths that must not cross or wait: the fused optimizer update
// (the streams run work late, on threads of their own, so an update that read the step or a buffer
// before its producer finished would show), same-device copies, integer division, and reductions
// onto logical GPUs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "gpu_sim/sim_devices.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::message_of;

using testing::kGpu0;
using testing::kGpu1;
using testing::kGpu2;

TransferCounts counts(const Device& d) { return transfer_counts(d); }

std::vector<float> values(int n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + salt * 3) % 17 - 8) / 8;
  return v;
}

TEST(SimulatedGpuCounters, CountBytesEachWayAndHostWaits) {
  const TransferCounts before = counts(kGpu2);
  Tensor<float> t = Tensor<float>::from_vector(values(100, 1), {100}, kGpu2);  // 400 bytes in
  const TransferCounts in = counts(kGpu2);
  EXPECT_EQ(in.host_to_device_bytes - before.host_to_device_bytes, 400u);
  EXPECT_EQ(in.device_to_host_bytes, before.device_to_host_bytes);
  EXPECT_EQ(t.to_vector(), values(100, 1));  // synchronize, then 400 bytes out
  const TransferCounts out = counts(kGpu2);
  EXPECT_EQ(out.device_to_host_bytes - in.device_to_host_bytes, 400u);
  EXPECT_EQ(out.host_to_device_bytes, in.host_to_device_bytes);
  EXPECT_EQ(out.host_syncs - in.host_syncs, 1u);
  // The host backend's memory is the host's: nothing crosses.
  Tensor<float> h = t.to(cpu0);
  const TransferCounts host = transfer_counts(cpu0);
  EXPECT_EQ(host.host_to_device_bytes, 0u);
  EXPECT_EQ(host.device_to_host_bytes, 0u);
  EXPECT_EQ(host.host_syncs, 0u);
  EXPECT_EQ(h.to_vector(), values(100, 1));
}

// Regression: apply_gradients copied every weight, gradient and slot of a GPU variable to the host
// and back, and read the step count from the device (28 bytes per parameter for Adam).
TEST(SimulatedGpuOptimizer, AnUpdateMovesNothingBetweenHostAndDevice) {
  std::vector<Variable<float>> vars;
  std::vector<Tensor<float>> grads;
  for (int k = 0; k < 3; ++k) {
    vars.emplace_back(Tensor<float>::from_vector(values(50 + k, k), {50 + k}, kGpu2));
    grads.push_back(Tensor<float>::from_vector(values(50 + k, k + 5), {50 + k}, kGpu2));
  }
  optimizers::Adam<> opt;
  opt.build(vars);
  optimizers::GradsAndVars<float> gv;
  for (int k = 0; k < 3; ++k) gv.emplace_back(grads[static_cast<std::size_t>(k)], vars[static_cast<std::size_t>(k)]);
  const TransferCounts before = counts(kGpu2);
  for (int step = 0; step < 10; ++step) opt.apply_gradients(gv);
  const TransferCounts after = counts(kGpu2);
  EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, 0u);
  EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, 0u);
  EXPECT_EQ(after.host_syncs - before.host_syncs, 0u);
  EXPECT_EQ(opt.iterations(), 10);
  EXPECT_EQ(opt.get_slot(vars[0], "m").value().device(), kGpu2);
}

// GradientAccumulator: device gradients are summed (and, for MEAN, divided) on the device, with no
// byte through the host and no host wait, and the step equals the host's bit for bit.
TEST(SimulatedGpuOptimizer, GradientAccumulationStaysOnTheDevice) {
  for (const ReduceOp op : {ReduceOp::SUM, ReduceOp::MEAN}) {
    Variable<float> on_gpu(Tensor<float>::from_vector(values(70, 1), {70}, kGpu2));
    Variable<float> on_host(Tensor<float>::from_vector(values(70, 1), {70}));
    optimizers::Adam<> gpu_opt, host_opt;
    gpu_opt.build({on_gpu});
    optimizers::GradientAccumulator<float> gpu_acc(op), host_acc(op);
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor<float>> grads;
      for (int j = 0; j < 3; ++j) grads.push_back(Tensor<float>::from_vector(values(70, 10 * step + j), {70}, kGpu2));
      const TransferCounts before = counts(kGpu2);
      for (const auto& g : grads) gpu_acc.accumulate({{g, on_gpu}});
      gpu_acc.apply_gradients(gpu_opt);
      const TransferCounts after = counts(kGpu2);
      EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, 0u);
      EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, 0u);
      EXPECT_EQ(after.host_syncs - before.host_syncs, 0u);
      for (const auto& g : grads) host_acc.accumulate({{g.to(cpu0), on_host}});
      host_acc.apply_gradients(host_opt);
    }
    EXPECT_EQ(on_gpu.value().to_vector(), on_host.value().to_vector()) << op;
    EXPECT_EQ(gpu_opt.iterations(), 3);
  }
}

// The simulated GPU computes with the host's loops: results equal the host's bit for bit, also
// with the step counter read on the stream, after the previous update wrote it.
TEST(SimulatedGpuOptimizer, EqualsTheHostBitwiseOverManySteps) {
  for (int kind = 0; kind < 3; ++kind) {
    auto make = [kind]() -> std::unique_ptr<optimizers::Optimizer<float>> {
      if (kind == 0) return std::make_unique<optimizers::SGD<float>>(optimizers::SGDOptions{0.01, 0.9, true});
      if (kind == 1) return std::make_unique<optimizers::Adam<float>>();
      return std::make_unique<optimizers::AdamW<float>>();
    };
    auto on_gpu = make();
    auto on_host = make();
    std::vector<Variable<float>> gpu_vars, host_vars;
    for (int k = 0; k < 4; ++k) {
      gpu_vars.emplace_back(Tensor<float>::from_vector(values(33 * (k + 1), k), {33 * (k + 1)}, kGpu2));
      host_vars.emplace_back(Tensor<float>::from_vector(values(33 * (k + 1), k), {33 * (k + 1)}));
    }
    for (int step = 1; step <= 200; ++step) {
      optimizers::GradsAndVars<float> g_gpu, g_host;
      for (int k = 0; k < 4; ++k) {
        Tensor<float> g = Tensor<float>::from_vector(values(33 * (k + 1), k + step), {33 * (k + 1)});
        g_gpu.emplace_back(g.to(kGpu2), gpu_vars[static_cast<std::size_t>(k)]);
        g_host.emplace_back(g, host_vars[static_cast<std::size_t>(k)]);
      }
      on_gpu->apply_gradients(g_gpu);
      on_host->apply_gradients(g_host);
    }
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(gpu_vars[static_cast<std::size_t>(k)].value().to_vector(),
                host_vars[static_cast<std::size_t>(k)].value().to_vector())
          << "optimizer " << kind << ", variable " << k;
    EXPECT_EQ(on_gpu->iterations(), 200);
  }
}

// Replicas on two logical GPUs of one chip: the whole step (the same-chip all-reduce and the
// fused update) stays on the device, and the copies stay identical to a host run.
TEST(SimulatedGpuOptimizer, AMirroredStepOnOneChipStaysOnTheDevice) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  MirroredStrategy host({"CPU:0", "CPU:1"});
  auto make_vars = [](Strategy& st) {
    auto scope = st.scope();
    std::vector<Variable<float>> v;
    v.emplace_back(Tensor<float>::from_vector(values(64, 1), {64}));
    v.emplace_back(Tensor<float>::from_vector(values(8, 2), {8}));
    return v;
  };
  auto gpu_vars = make_vars(s);
  auto host_vars = make_vars(host);
  optimizers::SGD<float> gpu_opt({.learning_rate = 0.5, .momentum = 0.5});
  optimizers::SGD<float> host_opt({.learning_rate = 0.5, .momentum = 0.5});
  {
    auto scope = s.scope();  // the slots and the step counter exist on the devices before counting
    gpu_opt.build(gpu_vars);
  }
  // Gradients made on each replica's device, before counting.
  std::vector<std::pair<Tensor<float>, Tensor<float>>> grads(2);
  for (int r = 0; r < 2; ++r) {
    const Device d = s.extended().worker_devices()[static_cast<std::size_t>(r)];
    grads[static_cast<std::size_t>(r)] = {Tensor<float>::from_vector(values(64, 3), {64}, d) * float(r + 1),
                                          Tensor<float>::from_vector(values(8, 4), {8}, d) * float(r + 1)};
  }
  const TransferCounts before0 = counts(kGpu0), before1 = counts(kGpu1);
  for (int step = 0; step < 5; ++step) {
    s.run([&] {
      const auto& g = grads[static_cast<std::size_t>(get_replica_context()->replica_id_in_sync_group())];
      gpu_opt.apply_gradients({{g.first, gpu_vars[0]}, {g.second, gpu_vars[1]}});
    });
  }
  const TransferCounts after0 = counts(kGpu0), after1 = counts(kGpu1);
  EXPECT_EQ(after0.host_to_device_bytes - before0.host_to_device_bytes, 0u);
  EXPECT_EQ(after0.device_to_host_bytes - before0.device_to_host_bytes, 0u);
  EXPECT_EQ(after1.host_to_device_bytes - before1.host_to_device_bytes, 0u);
  EXPECT_EQ(after1.device_to_host_bytes - before1.device_to_host_bytes, 0u);
  for (int step = 0; step < 5; ++step) {
    host.run([&] {
      const float r = static_cast<float>(get_replica_context()->replica_id_in_sync_group() + 1);
      host_opt.apply_gradients({{Tensor<float>::from_vector(values(64, 3), {64}) * r, host_vars[0]},
                                {Tensor<float>::from_vector(values(8, 4), {8}) * r, host_vars[1]}});
    });
  }
  for (std::size_t k = 0; k < 2; ++k) {
    const auto expected = host_vars[k].components()[0].to_vector();
    for (const auto& c : gpu_vars[k].components()) EXPECT_EQ(c.to_vector(), expected) << "variable " << k;
  }
  EXPECT_EQ(gpu_opt.iterations(), 5);
}

// Regression: a copy within one device waited for the device (copy_between synchronized).
TEST(SimulatedGpuHostWaits, ACopyWithinADeviceDoesNotWait) {
  const Tensor<float> t = Tensor<float>::from_vector(values(1000, 2), {1000}, kGpu2);
  const TransferCounts before = counts(kGpu2);
  const Tensor<float> copy = t.clone();
  const TransferCounts after = counts(kGpu2);
  EXPECT_EQ(after.host_syncs, before.host_syncs);
  EXPECT_EQ(after.host_to_device_bytes, before.host_to_device_bytes);
  EXPECT_EQ(copy.to_vector(), values(1000, 2));
}

// Regression: every integer division waited for its kernel to learn about a zero divisor.
TEST(SimulatedGpuHostWaits, IntegerDivisionByZeroIsRaisedByTheNextSynchronize) {
  const auto a = Tensor<int32_t>::from_vector({6, 8, 9}, {3}, kGpu2);
  const auto zero = Tensor<int32_t>::from_vector({2, 0, 3}, {3}, kGpu2);
  const auto b = Tensor<int32_t>::from_vector({2, 4, 3}, {3}, kGpu2);
  EXPECT_EQ((a / b).to_vector(), (std::vector<int32_t>{3, 2, 3}));
  const TransferCounts before = counts(kGpu2);
  Tensor<int32_t> q = a / zero;  // no wait, no error yet
  EXPECT_EQ(counts(kGpu2).host_syncs, before.host_syncs);
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)q.to_vector(); }),
            "div: integer division by zero at element 1 on GPU:2 (physical GPU 1)");
  // Raised once: the stream goes on.
  EXPECT_EQ((a / b).to_vector(), (std::vector<int32_t>{3, 2, 3}));
}

// Regression: compute_average_loss read the whole per-example loss back to the host every step.
TEST(SimulatedGpuHostWaits, ComputeAverageLossStaysOnTheDevice) {
  const std::vector<float> losses = {0.5f, 1.25f, 2.0f, 0.125f, 3.0f};
  const Tensor<float> on_gpu = Tensor<float>::from_vector(losses, {5}, kGpu2);
  const TransferCounts before = counts(kGpu2);
  const Tensor<float> average = nn::compute_average_loss(on_gpu, 8);
  const TransferCounts after = counts(kGpu2);
  EXPECT_EQ(after.device_to_host_bytes, before.device_to_host_bytes);
  EXPECT_EQ(after.host_syncs, before.host_syncs);
  EXPECT_EQ(average.device(), kGpu2);
  EXPECT_EQ(average.rank(), 0);
  EXPECT_EQ(average.item(), nn::compute_average_loss(Tensor<float>::from_vector(losses, {5}), 8).item());
  EXPECT_EQ(average.item(), 6.875f / 8);
}

// Regression: reduce_to onto a logical GPU went through host memory (a host buffer per pack, the
// sum copied to the host and back) and waited for every other logical GPU from the host.
TEST(SimulatedGpuHostWaits, ReduceToOntoALogicalGpuStaysOnTheDevice) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  auto per_replica = s.experimental_distribute_values_from_function([](const ValueContext& c) {
    const int r = c.replica_id_in_sync_group;
    return Tensor<float>::from_vector(values(256, r), {256}, Device(DeviceType::GPU, r)) * float(r + 1);
  });
  Variable<float> var = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>::zeros({256}));
  }();
  std::vector<float> expected(256);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = values(256, 0)[i] + 2 * values(256, 1)[i];
  for (int64_t bytes_per_pack : {int64_t{0}, int64_t{64}}) {
    const TransferCounts before0 = counts(kGpu0), before1 = counts(kGpu1);
    CommunicationOptions o;
    o.bytes_per_pack = bytes_per_pack;
    const Tensor<float> sum = s.extended().reduce_to(ReduceOp::SUM, per_replica, kGpu0, o);
    const auto batch = s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{per_replica, var}, {per_replica, var}}, o);
    const TransferCounts after0 = counts(kGpu0), after1 = counts(kGpu1);
    EXPECT_EQ(after0.host_to_device_bytes - before0.host_to_device_bytes, 0u) << bytes_per_pack;
    EXPECT_EQ(after0.device_to_host_bytes - before0.device_to_host_bytes, 0u) << bytes_per_pack;
    EXPECT_EQ(after1.host_to_device_bytes - before1.host_to_device_bytes, 0u) << bytes_per_pack;
    EXPECT_EQ(after1.device_to_host_bytes - before1.device_to_host_bytes, 0u) << bytes_per_pack;
    EXPECT_EQ(sum.device(), kGpu0);
    EXPECT_EQ(sum.to_vector(), expected);
    ASSERT_EQ(batch.size(), 2u);
    for (const auto& m : batch)
      for (const auto& c : m.values()) EXPECT_EQ(c.to_vector(), expected);
  }
}

// The device-resident step on the library's side (what train_digits does on CUDA GPUs, with the
// model math in the library's own tensor ops instead of the example's cuBLAS kernels, which a
// simulated GPU cannot run): per step, only the input batch goes host->device (the prefetcher's
// copies) and the loss scalar device->host; the gradients go through GradientBuckets and the
// fused optimizer without touching the host.
TEST(SimulatedGpuStep, OnlyTheBatchGoesInAndTheLossComesOut) {
  MirroredStrategy s({"GPU:0", "GPU:1"});
  constexpr int64_t kExamples = 16, kFeatures = 8, kGlobal = 4, kSteps = kExamples / kGlobal;
  std::vector<float> features(static_cast<std::size_t>(kExamples * kFeatures));
  for (std::size_t i = 0; i < features.size(); ++i) features[i] = static_cast<float>(i % 13) / 4;
  std::vector<int32_t> labels(static_cast<std::size_t>(kExamples));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 10);
  const auto dataset = data::Dataset<>::from_tensor_slices(Tensor<float>::from_vector(features, {kExamples, kFeatures}),
                                                           Tensor<int32_t>::from_vector(labels, {kExamples}))
                           .batch(kGlobal);
  Variable<float> w = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>::full({kGlobal / 2, kFeatures}, 0.5f));
  }();
  optimizers::Adam<float> opt;
  {
    auto scope = s.scope();
    opt.build({w});
  }
  using Batch = std::tuple<Tensor<float>, Tensor<int32_t>>;
  const auto dist = s.experimental_distribute_dataset(dataset);
  const TransferCounts before0 = counts(kGpu0), before1 = counts(kGpu1);
  double total_loss = 0;
  int64_t steps = 0;
  for (const PerReplica<Batch>& batch : dist) {
    auto losses = s.run(
        [&](const Batch& b) {
          const auto& [x, y] = b;
          // "Forward": per-example losses from the weights, on the device.
          const Tensor<float> per_example = (x * w.value()).reshape({x.numel()});
          // "Backward": gradients on the device, all-reduced in buckets, then the fused update.
          GradientBuckets<float> buckets;
          buckets.push(x * 0.25f);
          const auto reduced = buckets.finish();
          opt.apply_gradients({{reduced[0], w}}, /*skip_gradients_aggregation=*/true);
          return nn::compute_average_loss(per_example, kGlobal * kFeatures);
        },
        batch);
    total_loss += s.reduce(ReduceOp::SUM, losses, std::nullopt).item();
    ++steps;
  }
  const TransferCounts after0 = counts(kGpu0), after1 = counts(kGpu1);
  EXPECT_EQ(steps, kSteps);
  // Each replica's slice of every batch: 2 examples of 8 floats and 2 int32 labels.
  const uint64_t batch_bytes = kExamples * (kFeatures * sizeof(float) + sizeof(int32_t));
  EXPECT_EQ((after0.host_to_device_bytes - before0.host_to_device_bytes) +
                (after1.host_to_device_bytes - before1.host_to_device_bytes),
            batch_bytes);
  const uint64_t out = (after0.device_to_host_bytes - before0.device_to_host_bytes) +
                       (after1.device_to_host_bytes - before1.device_to_host_bytes);
  EXPECT_EQ(out, sizeof(float) * kSteps) << "the summed loss scalar of each step only";
  EXPECT_TRUE(std::isfinite(total_loss));
}

}  // namespace
}  // namespace mirrored
