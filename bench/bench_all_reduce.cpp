// In-process all-reduce inside `strategy.run`, reported as a ratio to an anchor measured in the
// same process, on the same buffers and the same replica threads.
//
//   all-reduce: each replica calls get_replica_context()->all_reduce(SUM, x) on its own
//               pre-allocated Tensor<float> x of S bytes. InProcessAllReduce has every replica
//               read its 1/N slice of all N inputs and write it to all N outputs: S read + S
//               written per replica. The output tensor is allocated by all_reduce on every call
//               (users pay for it), and freed before the replica function returns.
//   anchor:     a `strategy.run` in which each replica does one read-modify-write pass over the
//               same S-byte buffer (x[i] += 1): S read + S written per replica.
//   alloc:      (diagnostic) a `strategy.run` in which each replica allocates an S-byte tensor,
//               touches one byte per 4 KiB page and frees it: what allocating the fresh output
//               costs, page faults included.
//   empty:      (diagnostic) a `strategy.run` of an empty function: the dispatch cost that the
//               three others include too.
//
// All four are timed with steady_clock inside the same benchmark iteration (order rotated each
// iteration), so they see the same machine state. Manual time = all-reduce time. Counters:
//   allreduce_ms, anchor_ms, alloc_ms, run_ms   mean wall time of one call of each
//   ratio        anchor_ms / allreduce_ms (1.0 = all-reduce as fast as one pass over memory)
//   ratio_med    median over iterations of anchor / all-reduce of the same iteration (paired,
//                so robust to load that comes and goes; needs several iterations)
//   alloc_share  (alloc_ms - run_ms) / allreduce_ms: the share of the all-reduce that allocating
//                (and first touching) the fresh output costs
//   allreduce_GBps, anchor_GBps   2*S*N bytes (read + written, all replicas) per second
//   vs_empty     allreduce_ms / run_ms: what a collective adds to an empty run (small sizes: the
//                rendezvous)
//
// BM_CrossReplica: the cross-replica calls at the memory limit, 64 MiB per replica.
//   reduce      strategy.reduce(SUM, per_replica, axis=None): reads N·S, writes S on the host. Its
//               floor is (N + 1) / 2N of the all-reduce of the same values timed in the same
//               iteration (which reads and writes N·S); reduce_vs_floor = (reduce / all-reduce) /
//               floor (target <= 1.15).
//   gather      strategy.gather(per_replica, 0): reads N·S, writes N·S on the host.
//   copy        (gather's anchor, the same traffic) a run in which every replica copies its value
//               into its place of a preallocated host buffer with memcpy; gather_ratio = copy / gather.
//
// Pass --benchmark_filter=... as usual; see bench/README.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "bench_util.hpp"

namespace {

using mirrored::Device;
using mirrored::MirroredStrategy;
using mirrored::ReduceOp;
using mirrored::Tensor;
using Clock = std::chrono::steady_clock;

using mirrored::bench::strategy_for;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

void BM_AllReduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
  MirroredStrategy& strategy = strategy_for(n);

  // Per-replica inputs on the replica's device, filled (so their pages exist) before timing.
  std::vector<Tensor<float>> inputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(
        Tensor<float>::full({numel}, static_cast<float>(r + 1), Device::parse("CPU:" + std::to_string(r))));
  }
  const mirrored::PerReplica<Tensor<float>> per_replica(inputs);

  auto anchor_fn = [&] {
    const int r = mirrored::get_replica_context()->replica_id_in_sync_group();
    float* p = inputs[static_cast<std::size_t>(r)].data();
    for (int64_t i = 0; i < numel; ++i) p[i] += 1.0f;
    benchmark::DoNotOptimize(p);
    benchmark::ClobberMemory();
  };
  auto all_reduce_fn = [](const Tensor<float>& x) {
    Tensor<float> out = mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, x);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  };
  auto alloc_fn = [&] {
    Tensor<float> out = Tensor<float>::empty({numel});
    auto* p = reinterpret_cast<volatile unsigned char*>(out.data());
    for (int64_t b = 0; b < bytes; b += 4096) p[b] = 1;
  };

  // Sanity check (not timed): one all-reduce must give every replica the sum of the inputs.
  {
    // Inputs hold r+1 now; the anchor adds 1 per call to every input, so check before timing.
    auto outs = strategy.run(
        [](const Tensor<float>& x) { return mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, x); },
        per_replica);
    const float expect = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
    for (int r = 0; r < n; ++r) {
      const float* o = outs[static_cast<std::size_t>(r)].data();
      if (o[0] != expect || o[numel - 1] != expect || o[numel / 2] != expect) {
        state.SkipWithError("all_reduce returned a wrong sum");
        return;
      }
    }
  }
  // Warm-up: pool threads awake, allocator state as in steady state.
  strategy.run(anchor_fn);
  strategy.run(all_reduce_fn, per_replica);

  double sum_ar = 0, sum_anchor = 0, sum_alloc = 0, sum_empty = 0;
  std::vector<double> paired;  // anchor / all-reduce, per iteration
  int64_t iters = 0;
  for (auto _ : state) {
    double t[4] = {0, 0, 0, 0};  // all-reduce, anchor, alloc, empty
    // Rotate the order so no measurement always follows the same one.
    for (int k = 0; k < 4; ++k) {
      const int which = static_cast<int>((iters + k) % 4);
      const auto t0 = Clock::now();
      switch (which) {
        case 0: strategy.run(all_reduce_fn, per_replica); break;
        case 1: strategy.run(anchor_fn); break;
        case 2: strategy.run(alloc_fn); break;
        default: strategy.run([] {}); break;
      }
      t[which] = seconds(Clock::now() - t0);
    }
    const double t_ar = t[0], t_anchor = t[1];
    state.SetIterationTime(t_ar);
    sum_ar += t_ar;
    sum_anchor += t_anchor;
    sum_alloc += t[2];
    sum_empty += t[3];
    paired.push_back(t_anchor / t_ar);
    ++iters;
  }
  if (iters == 0) return;
  const double it = static_cast<double>(iters);
  const double moved = 2.0 * static_cast<double>(bytes) * n;  // read S + write S, every replica
  state.counters["allreduce_ms"] = sum_ar / it * 1e3;
  state.counters["anchor_ms"] = sum_anchor / it * 1e3;
  state.counters["alloc_ms"] = sum_alloc / it * 1e3;
  state.counters["run_ms"] = sum_empty / it * 1e3;
  state.counters["ratio"] = sum_anchor / sum_ar;
  state.counters["ratio_med"] = median(paired);
  state.counters["vs_empty"] = sum_ar / sum_empty;
  state.counters["alloc_share"] = std::max(0.0, sum_alloc - sum_empty) / sum_ar;
  state.counters["allreduce_GBps"] = moved / (sum_ar / it) / 1e9;
  state.counters["anchor_GBps"] = moved / (sum_anchor / it) / 1e9;
  state.SetBytesProcessed(static_cast<int64_t>(moved) * iters);
  state.SetLabel("N=" + std::to_string(n) + " S=" +
                 (bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB"));
}

void BM_CrossReplica(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
  MirroredStrategy& strategy = strategy_for(n);
  std::vector<Tensor<float>> inputs;
  for (int r = 0; r < n; ++r)
    inputs.push_back(
        Tensor<float>::full({numel}, static_cast<float>(r + 1), Device::parse("CPU:" + std::to_string(r))));
  const mirrored::PerReplica<Tensor<float>> per_replica(inputs);
  Tensor<float> gathered_by_hand = Tensor<float>::zeros({numel * n});
  auto all_reduce_fn = [](const Tensor<float>& x) {
    Tensor<float> out = mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, x);
    benchmark::DoNotOptimize(out.data());
  };
  auto copy_fn = [&](const Tensor<float>& x) {
    const int r = mirrored::get_replica_context()->replica_id_in_sync_group();
    std::memcpy(gathered_by_hand.data() + r * numel, x.data(), x.bytes());
    benchmark::ClobberMemory();
  };
  // Sanity check (not timed).
  {
    const Tensor<float> sum = strategy.reduce(ReduceOp::SUM, per_replica, std::nullopt);
    const Tensor<float> all = strategy.gather(per_replica, 0);
    const float expect = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
    if (sum.data()[0] != expect || sum.data()[numel - 1] != expect || all.data()[numel * n - 1] != float(n)) {
      state.SkipWithError("reduce or gather returned a wrong value");
      return;
    }
  }
  double t_sum[4] = {0, 0, 0, 0};  // all-reduce, reduce, gather, copy
  int64_t iters = 0;
  for (auto _ : state) {
    double t[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; ++k) {
      const int which = static_cast<int>((iters + k) % 4);
      const auto t0 = Clock::now();
      switch (which) {
        case 0: strategy.run(all_reduce_fn, per_replica); break;
        case 1: benchmark::DoNotOptimize(strategy.reduce(ReduceOp::SUM, per_replica, std::nullopt).data()); break;
        case 2: benchmark::DoNotOptimize(strategy.gather(per_replica, 0).data()); break;
        default: strategy.run(copy_fn, per_replica); break;
      }
      t[which] = seconds(Clock::now() - t0);
    }
    state.SetIterationTime(t[1]);
    for (int k = 0; k < 4; ++k) t_sum[k] += t[k];
    ++iters;
  }
  const double it = static_cast<double>(iters);
  const double floor = (n + 1.0) / (2.0 * n);
  state.counters["allreduce_ms"] = t_sum[0] / it * 1e3;
  state.counters["reduce_ms"] = t_sum[1] / it * 1e3;
  state.counters["gather_ms"] = t_sum[2] / it * 1e3;
  state.counters["copy_ms"] = t_sum[3] / it * 1e3;
  state.counters["reduce_vs_ar"] = t_sum[1] / t_sum[0];
  state.counters["reduce_floor"] = floor;
  state.counters["reduce_vs_floor"] = t_sum[1] / t_sum[0] / floor;
  state.counters["gather_ratio"] = t_sum[3] / t_sum[2];
}

BENCHMARK(BM_CrossReplica)
    ->ArgNames({"replicas", "bytes"})
    ->ArgsProduct({{2, 4}, {64 << 20}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_AllReduce)
    ->ArgNames({"replicas", "bytes"})
    ->ArgsProduct({{2, 4, 8}, {64 << 10, 4 << 20, 64 << 20}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
