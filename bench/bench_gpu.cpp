// GPU benchmarks, each reported as a ratio to an anchor measured in the same process on the same
// GPU (tools/gpu-check.sh runs them and prints the table). GPU 0 is split into two logical GPUs
// before anything else (GPU:0 and GPU:1 below are both on physical GPU 0).
//
//   BM_AllReduceSameGpu   strategy.run on {GPU:0, GPU:1}: each replica all-reduces (SUM) its own
//                         256 MiB float tensor (the default ops for logical GPUs of one chip:
//                         ReductionToOneDevice, one fused kernel), then both streams are
//                         synchronised.
//                         anchor: a device-to-device cudaMemcpyAsync of each replica's 256 MiB
//                         (2 copies, on the two replicas' streams), synchronised. An all-reduce
//                         must at least write every replica's output once, which is what the anchor
//                         does. ratio = anchor_ms / allreduce_ms (target >= 0.8).
//   BM_HostToDevice       Tensor<float>::to(GPU:0) of a 64 MiB host tensor (pageable memory: the
//                         backend stages it through pinned buffers), and the backend's copy from a
//                         pinned host buffer (direct DMA).
//                         anchor: cudaMemcpyAsync of the same bytes from pinned memory + sync.
//                         ratio = anchor_ms / tensor_to_ms; ratio_pinned = anchor_ms / pinned_ms
//                         (target >= 0.9 for the prefetch path, which stages into pinned memory).
//   BM_PrefetchToDevice   experimental_distribute_dataset on {GPU:0, GPU:1} (fetch to device, the
//                         default): every step delivers a 64 MiB global batch from host memory as
//                         two 32 MiB slices, one per logical GPU, copied on the GPUs' copy streams
//                         by the iterator's prefetch thread. The loop only takes the steps, so it
//                         measures the input path's throughput; the source yields one host tensor
//                         again and again (no batching copies), whose host block the backend pins
//                         on first use.
//                         anchor: cudaMemcpyAsync of the 64 MiB from pinned memory + sync, per step.
//                         ratio = anchor_ms / step_ms (target >= 0.9).
//   BM_AdamStep           Adam::apply_gradients on {GPU:0, GPU:1} of 25 MB of gradients in 100
//                         tensors, unsharded and with shard_optimizer_state (reduce-scatter, the
//                         fused kernel on the slice, all-gather), then both streams synchronised.
//                         anchor: one all-reduce (SUM) of a 25 MB tensor per replica, synchronised.
//                         update_share = (step - anchor) / step: what the update adds to the
//                         gradients' reduction (target: <= 10 % where the interconnect bounds the
//                         reduction); state_ratio: optimizer state per replica, sharded / unsharded.
//   BM_AdamStepNccl       BM_AdamStep on {GPU:0, GPU:2}, two physical GPUs (registered only where
//                         there are two): NcclAllReduce, whose sharded step is one stream-ordered
//                         sequence (grouped reduce-scatter, the fused update of the slice, grouped
//                         all-gather; nccl_optimizer_step.cpp). Same counters.
//   BM_AdamStepNcclOneRank  BM_AdamStep on {GPU:0} alone through NCCL's one-rank communicator
//                         (MIRRORED_NCCL_SINGLE_RANK): the fused sharded step's code on one GPU,
//                         where reduce-scatter and all-gather are copies. Same counters.
//   BM_CompressionCasts   the compression's casts on GPU:0 (CommunicationOptions::compression across
//                         workers): 64 MiB of floats to float16 and back (the backend's cast kernel).
//                         anchor: a D2D cudaMemcpyAsync of the 64 MiB. ratio = anchor_ms / cast_ms
//                         (the casts move 12 bytes an element to the copy's 8: about 0.67 at best).
//                         bus_ratio = floats_bus_ms / (cast_ms + halves_bus_ms): the floats' round
//                         trip to pinned host memory against the casts and the halves' round trip
//                         (what compressing on the GPU saves on the way to the other workers).
//   BM_EmptyRun           strategy.run of an empty function on {GPU:0, GPU:1}: run_us per call.
//
// Built only in CUDA builds; without a GPU it prints why and exits 0.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <mirrored/mirrored.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <mirrored/config.hpp>
#include <mirrored/cuda.hpp>
#include <mirrored/optimizers.hpp>

namespace {

using mirrored::Device;
using mirrored::DeviceType;
using mirrored::MirroredStrategy;
using mirrored::ReduceOp;
using mirrored::Tensor;
using Clock = std::chrono::steady_clock;

const Device kGpu0(DeviceType::GPU, 0);
const Device kGpu1(DeviceType::GPU, 1);

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gpu: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

MirroredStrategy& two_logical() {
  static MirroredStrategy* s = new MirroredStrategy({"GPU:0", "GPU:1"});  // never destroyed: lives until exit
  return *s;
}

void sync_both() {
  check(cudaStreamSynchronize(mirrored::cuda::stream(kGpu0)), "sync GPU:0");
  check(cudaStreamSynchronize(mirrored::cuda::stream(kGpu1)), "sync GPU:1");
}

void BM_AllReduceSameGpu(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  MirroredStrategy& s = two_logical();
  std::vector<Tensor<float>> xs = {Tensor<float>::full({n}, 1.0f, kGpu0), Tensor<float>::full({n}, 2.0f, kGpu1)};
  std::vector<Tensor<float>> dst = {Tensor<float>::empty({n}, kGpu0), Tensor<float>::empty({n}, kGpu1)};
  const mirrored::PerReplica<Tensor<float>> inputs(xs);
  auto all_reduce = [&] {
    s.run([](const Tensor<float>& x) { (void)mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, x); }, inputs);
    sync_both();
  };
  auto anchor = [&] {
    for (int r = 0; r < 2; ++r) {
      const Device d(DeviceType::GPU, r);
      check(cudaMemcpyAsync(dst[r].data(), xs[r].data(), static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice,
                            mirrored::cuda::stream(d)),
            "cudaMemcpyAsync D2D");
    }
    sync_both();
  };
  all_reduce();  // warm: caches, kernels
  anchor();
  double ar_ms = 0, anchor_ms = 0;
  std::vector<double> ratios;
  for (auto _ : state) {
    auto t = Clock::now();
    all_reduce();
    const double a = ms_since(t);
    t = Clock::now();
    anchor();
    const double b = ms_since(t);
    ar_ms += a;
    anchor_ms += b;
    ratios.push_back(b / a);
    state.SetIterationTime(a / 1e3);
  }
  const double iters = static_cast<double>(state.iterations());
  std::sort(ratios.begin(), ratios.end());
  state.counters["allreduce_ms"] = ar_ms / iters;
  state.counters["anchor_ms"] = anchor_ms / iters;
  state.counters["ratio"] = anchor_ms / ar_ms;
  state.counters["ratio_med"] = ratios[ratios.size() / 2];
  state.counters["allreduce_GBps"] = 2.0 * 2.0 * static_cast<double>(bytes) / (ar_ms / iters) / 1e6;
}

void BM_HostToDevice(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  std::vector<float> values(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i % 977);
  const Tensor<float> host = Tensor<float>::from_vector(values, {n});
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, static_cast<std::size_t>(bytes), cudaHostAllocDefault), "cudaHostAlloc");
  std::memcpy(pinned, values.data(), static_cast<std::size_t>(bytes));
  Tensor<float> dev = Tensor<float>::empty({n}, kGpu0);
  auto& backend = mirrored::detail::backend_for(kGpu0);
  const cudaStream_t stream = mirrored::cuda::stream(kGpu0);
  auto tensor_to = [&] { benchmark::DoNotOptimize(host.to(kGpu0)); };
  auto pinned_copy = [&] {
    backend.copy_from_host(dev.data(), pinned, static_cast<std::size_t>(bytes));
    backend.synchronize();
  };
  auto anchor = [&] {
    check(cudaMemcpyAsync(dev.data(), pinned, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync H2D");
    check(cudaStreamSynchronize(stream), "sync");
  };
  tensor_to();
  pinned_copy();
  anchor();
  double to_ms = 0, pinned_ms = 0, anchor_ms = 0;
  for (auto _ : state) {
    auto t = Clock::now();
    tensor_to();
    const double a = ms_since(t);
    t = Clock::now();
    pinned_copy();
    const double b = ms_since(t);
    t = Clock::now();
    anchor();
    const double c = ms_since(t);
    to_ms += a;
    pinned_ms += b;
    anchor_ms += c;
    state.SetIterationTime(a / 1e3);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["tensor_to_ms"] = to_ms / iters;
  state.counters["pinned_ms"] = pinned_ms / iters;
  state.counters["anchor_ms"] = anchor_ms / iters;
  state.counters["ratio"] = anchor_ms / to_ms;
  state.counters["ratio_pinned"] = anchor_ms / pinned_ms;
  state.counters["anchor_GBps"] = static_cast<double>(bytes) / (anchor_ms / iters) / 1e6;
  cudaFreeHost(pinned);
}

void BM_PrefetchToDevice(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  constexpr int64_t kWidth = 16384;  // 64 KiB rows
  constexpr int kSteps = 16;
  const int64_t rows = bytes / (kWidth * static_cast<int64_t>(sizeof(float)));
  std::vector<float> values(static_cast<std::size_t>(rows * kWidth));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 977);
  const Tensor<float> batch = Tensor<float>::from_vector(values, {rows, kWidth});
  MirroredStrategy& s = two_logical();
  auto dist = s.experimental_distribute_dataset(
      mirrored::data::Dataset<>::range(kSteps).map([batch](const Tensor<int64_t>&) { return batch; }));
  auto epoch = [&] {
    int steps = 0;
    for (const auto& x : dist) {
      benchmark::DoNotOptimize(x.values().data());
      ++steps;
    }
    if (steps != kSteps) {
      std::fprintf(stderr, "bench_gpu: the distributed dataset gave %d steps, not %d\n", steps, kSteps);
      std::exit(1);
    }
  };
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, static_cast<std::size_t>(bytes), cudaHostAllocDefault), "cudaHostAlloc");
  std::memcpy(pinned, values.data(), static_cast<std::size_t>(bytes));
  Tensor<float> dev = Tensor<float>::empty({rows * kWidth}, kGpu0);
  const cudaStream_t stream = mirrored::cuda::stream(kGpu0);
  auto anchor = [&] {
    for (int i = 0; i < kSteps; ++i) {
      check(cudaMemcpyAsync(dev.data(), pinned, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync H2D");
      check(cudaStreamSynchronize(stream), "sync");
    }
  };
  epoch();  // warm: pins the host block, creates the copy streams, fills the device caches
  anchor();
  double step_ms = 0, anchor_ms = 0;
  for (auto _ : state) {
    auto t = Clock::now();
    epoch();
    const double a = ms_since(t) / kSteps;
    t = Clock::now();
    anchor();
    const double b = ms_since(t) / kSteps;
    step_ms += a;
    anchor_ms += b;
    state.SetIterationTime(a * kSteps / 1e3);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["step_ms"] = step_ms / iters;
  state.counters["anchor_ms"] = anchor_ms / iters;
  state.counters["ratio"] = anchor_ms / step_ms;
  state.counters["prefetch_GBps"] = static_cast<double>(bytes) / (step_ms / iters) / 1e6;
  state.counters["anchor_GBps"] = static_cast<double>(bytes) / (anchor_ms / iters) / 1e6;
  cudaFreeHost(pinned);
}

void sync_all(const std::vector<Device>& devices) {
  for (const Device& d : devices) check(cudaStreamSynchronize(mirrored::cuda::stream(d)), "cudaStreamSynchronize");
}

// BM_AdamStep's measurement on the replicas `devices` of `s`.
void adam_step(benchmark::State& state, MirroredStrategy& s, const std::vector<Device>& devices) {
  constexpr int kTensors = 100;
  constexpr int64_t kFloats = 25'000'000 / 4 / kTensors;
  const int n = static_cast<int>(devices.size());
  auto make_vars = [&] {
    std::vector<mirrored::Variable<float>> vars;
    auto scope = s.scope();
    for (int i = 0; i < kTensors; ++i) vars.emplace_back(Tensor<float>::zeros({kFloats}));
    return vars;
  };
  const auto plain_vars = make_vars(), sharded_vars = make_vars();
  std::vector<std::vector<Tensor<float>>> grads(static_cast<std::size_t>(n));
  std::vector<Tensor<float>> whole;
  for (int r = 0; r < n; ++r) {
    const Device& d = devices[static_cast<std::size_t>(r)];
    for (int i = 0; i < kTensors; ++i) grads[r].push_back(Tensor<float>::full({kFloats}, 1e-3f, d));
    whole.push_back(Tensor<float>::full({kFloats * kTensors}, 1e-3f, d));
  }
  mirrored::optimizers::Adam<float> plain({.learning_rate = 1e-3});
  mirrored::optimizers::Adam<float> sharded({.learning_rate = 1e-3, .shard_optimizer_state = true});
  auto step = [&](mirrored::optimizers::Adam<float>& opt, const std::vector<mirrored::Variable<float>>& vars) {
    s.run([&] {
      const int r = mirrored::get_replica_context()->replica_id_in_sync_group();
      mirrored::optimizers::GradsAndVars<float> gv;
      for (int i = 0; i < kTensors; ++i) gv.emplace_back(grads[r][i], vars[i]);
      opt.apply_gradients(gv);
    });
    sync_all(devices);
  };
  auto anchor = [&] {
    s.run([&] {
      const int r = mirrored::get_replica_context()->replica_id_in_sync_group();
      (void)mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, whole[r]);
    });
    sync_all(devices);
  };
  step(plain, plain_vars);  // warm: slots, caches, kernels (and NCCL's communicators)
  step(sharded, sharded_vars);
  anchor();
  double plain_ms = 0, sharded_ms = 0, anchor_ms = 0;
  for (auto _ : state) {
    auto t = Clock::now();
    anchor();
    anchor_ms += ms_since(t);
    t = Clock::now();
    step(plain, plain_vars);
    const double a = ms_since(t);
    plain_ms += a;
    t = Clock::now();
    step(sharded, sharded_vars);
    sharded_ms += ms_since(t);
    state.SetIterationTime(a / 1e3);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["anchor_ms"] = anchor_ms / iters;
  state.counters["adam_ms"] = plain_ms / iters;
  state.counters["adam_sharded_ms"] = sharded_ms / iters;
  state.counters["update_share"] = (plain_ms - anchor_ms) / plain_ms;
  state.counters["update_share_sharded"] = (sharded_ms - anchor_ms) / sharded_ms;
  state.counters["state_ratio"] = static_cast<double>(sharded.state_bytes_per_replica()[0]) /
                                  static_cast<double>(plain.state_bytes_per_replica()[0]);
}

void BM_AdamStep(benchmark::State& state) { adam_step(state, two_logical(), {kGpu0, kGpu1}); }

// Registered only with two physical GPUs or more: GPU:0 (on physical GPU 0) and GPU:2 (physical
// GPU 1, after the split of GPU 0), whose default ops are NcclAllReduce.
void BM_AdamStepNccl(benchmark::State& state) {
  const Device other(DeviceType::GPU, 2);
  static MirroredStrategy* s = new MirroredStrategy({"GPU:0", "GPU:2"});  // never destroyed: lives until exit
  adam_step(state, *s, {kGpu0, other});
  state.SetLabel(s->extended().cross_device_ops().name());
}

// One replica on GPU:0 through NCCL's one-rank communicator (MIRRORED_NCCL_SINGLE_RANK, set in
// main): the fused sharded step's code on a machine with one GPU.
void BM_AdamStepNcclOneRank(benchmark::State& state) {
  static MirroredStrategy* s =  // never destroyed: lives until exit
      new MirroredStrategy({"GPU:0"}, std::make_shared<mirrored::NcclAllReduce>());
  adam_step(state, *s, {kGpu0});
}

void BM_CompressionCasts(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  auto& backend = mirrored::detail::backend_for(kGpu0);
  const cudaStream_t stream = mirrored::cuda::stream(kGpu0);
  const Tensor<float> x = Tensor<float>::full({n}, 1.5f, kGpu0);
  Tensor<float> back = Tensor<float>::empty({n}, kGpu0);
  Tensor<mirrored::float16> halves = Tensor<mirrored::float16>::empty({n}, kGpu0);
  void* pinned = nullptr;
  check(cudaHostAlloc(&pinned, static_cast<std::size_t>(bytes), cudaHostAllocDefault), "cudaHostAlloc");
  const auto f32 = mirrored::DType::float32, f16 = mirrored::DType::float16;
  auto casts = [&] {
    backend.cast(f32, x.data(), f16, halves.data(), n);
    backend.cast(f16, halves.data(), f32, back.data(), n);
    check(cudaStreamSynchronize(stream), "sync");
  };
  // What crosses between the workers' hosts and the GPU: the halves, or the floats.
  auto bus = [&](void* src, void* dst, std::size_t b) {
    check(cudaMemcpyAsync(pinned, src, b, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync D2H");
    check(cudaMemcpyAsync(dst, pinned, b, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync H2D");
    check(cudaStreamSynchronize(stream), "sync");
  };
  auto anchor = [&] {
    check(cudaMemcpyAsync(back.data(), x.data(), static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync D2D");
    check(cudaStreamSynchronize(stream), "sync");
  };
  casts();
  anchor();
  double cast_ms = 0, anchor_ms = 0, halves_ms = 0, floats_ms = 0;
  for (auto _ : state) {
    auto t = Clock::now();
    casts();
    const double a = ms_since(t);
    cast_ms += a;
    t = Clock::now();
    anchor();
    anchor_ms += ms_since(t);
    t = Clock::now();
    bus(halves.data(), halves.data(), static_cast<std::size_t>(bytes) / 2);
    halves_ms += ms_since(t);
    t = Clock::now();
    bus(back.data(), back.data(), static_cast<std::size_t>(bytes));
    floats_ms += ms_since(t);
    state.SetIterationTime(a / 1e3);
  }
  if (back.to_vector()[static_cast<std::size_t>(n - 1)] != 1.5f) state.SkipWithError("the casts lost 1.5");
  const double iters = static_cast<double>(state.iterations());
  state.counters["cast_ms"] = cast_ms / iters;
  state.counters["anchor_ms"] = anchor_ms / iters;
  state.counters["ratio"] = anchor_ms / cast_ms;
  state.counters["halves_bus_ms"] = halves_ms / iters;
  state.counters["floats_bus_ms"] = floats_ms / iters;
  state.counters["bus_ratio"] = floats_ms / (cast_ms + halves_ms);
  cudaFreeHost(pinned);
}

void BM_EmptyRun(benchmark::State& state) {
  MirroredStrategy& s = two_logical();
  s.run([] {});
  constexpr int kBatch = 64;
  double total_ms = 0;
  for (auto _ : state) {
    const auto t = Clock::now();
    for (int i = 0; i < kBatch; ++i) s.run([] {});
    const double ms = ms_since(t);
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  state.counters["run_us"] = total_ms * 1e3 / (static_cast<double>(state.iterations()) * kBatch);
}

BENCHMARK(BM_AllReduceSameGpu)->Arg(int64_t{256} << 20)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_HostToDevice)->Arg(int64_t{64} << 20)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_PrefetchToDevice)->Arg(int64_t{64} << 20)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_AdamStep)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_CompressionCasts)->Arg(int64_t{64} << 20)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_EmptyRun)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);

}  // namespace

int main(int argc, char** argv) {
  if (mirrored::list_logical_devices(DeviceType::GPU).empty()) {
    std::printf("bench_gpu: skipped: no GPU is visible to this process\n");
    return 0;
  }
  // Before any GPU use: GPU:0 and GPU:1 become two logical GPUs of physical GPU 0.
  mirrored::config::set_logical_gpu_devices(0, 2);
  // Before any NcclAllReduce exists and before any thread: BM_AdamStepNcclOneRank's one replica
  // goes through NCCL (no other benchmark has a single replica with NcclAllReduce).
  ::setenv("MIRRORED_NCCL_SINGLE_RANK", "1", 1);
  if (MIRRORED_HAVE_NCCL) {
    benchmark::RegisterBenchmark("BM_AdamStepNcclOneRank", BM_AdamStepNcclOneRank)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  }
  int physical = 0;
  check(cudaGetDeviceCount(&physical), "cudaGetDeviceCount");
  if (physical >= 2) {
    benchmark::RegisterBenchmark("BM_AdamStepNccl", BM_AdamStepNccl)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  } else {
    std::printf("bench_gpu: BM_AdamStepNccl skipped: NCCL needs two physical GPUs, %d visible\n", physical);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
