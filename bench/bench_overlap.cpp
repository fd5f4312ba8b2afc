// Communication overlapping computation: a "backward pass" produces 8 gradient tensors one after
// another, each after some compute, and GradientBuckets all-reduces them as they come (one
// gradient per bucket), inside `strategy.run`. Three runs per iteration, in rotated order:
//
//   step:     per replica, 8 x (compute W; push gradient k), then finish()
//   compute:  8 x compute W, no collective
//   comm:     the 8 pushes and finish(), no compute
//
// ratio = step / max(compute, comm): 1.0 when the communication hides completely behind the
// compute; without overlap the step costs the sum. The last bucket cannot overlap anything (it is
// full only when the compute is over): with compute = comm its all-reduce alone adds 1/8.
// W is calibrated before timing: `compute_per_comm` x (the comm run's median time) / 8.
// Compute is a sleep (a device's kernels, which leave the host's cores to the library's
// communication threads) or, with busy = 1, a busy loop on the replica thread (host compute,
// which competes with them for cores: with R replicas the step needs 2R runnable threads).
// Gradients are pre-allocated and pushed as shared handles, so the all-reduce allocates its
// outputs in all three runs alike.
//
// Counters: step_ms, compute_ms, comm_ms (means), ratio (step / max of the means), ratio_med
// (median over iterations of the same ratio within one iteration), W_ms.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "bench_util.hpp"

namespace {

using mirrored::GradientBuckets;
using mirrored::PerReplica;
using mirrored::ReduceOp;
using mirrored::Tensor;
using Clock = std::chrono::steady_clock;

constexpr int kGradients = 8;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

void compute(double s, bool busy) {
  if (!busy) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
    return;
  }
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  uint64_t spins = 0;
  while (Clock::now() < until) benchmark::DoNotOptimize(++spins);
}

void BM_Overlap(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  const bool busy = state.range(2) != 0;
  const double compute_per_comm = static_cast<double>(state.range(3)) / 100.0;
  const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
  auto& strategy = mirrored::bench::strategy_for(n);

  // Per replica, its 8 gradients (pages touched before timing).
  std::vector<std::vector<Tensor<float>>> grads(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < kGradients; ++k)
      grads[static_cast<std::size_t>(r)].push_back(
          Tensor<float>::full({numel}, float(r + k), mirrored::Device::parse("CPU:" + std::to_string(r))));
  }
  const PerReplica<std::vector<Tensor<float>>> per_replica(grads);
  double w = 0;  // seconds of compute before each gradient
  auto step = [&](const std::vector<Tensor<float>>& g) {
    GradientBuckets<float> buckets(ReduceOp::SUM, bytes);
    for (const auto& t : g) {
      compute(w, busy);
      buckets.push(t);
    }
    auto reduced = buckets.finish();
    benchmark::DoNotOptimize(reduced);
  };
  auto comm = [&](const std::vector<Tensor<float>>& g) {
    GradientBuckets<float> buckets(ReduceOp::SUM, bytes);
    for (const auto& t : g) buckets.push(t);
    auto reduced = buckets.finish();
    benchmark::DoNotOptimize(reduced);
  };
  auto compute_only = [&] {
    for (int k = 0; k < kGradients; ++k) compute(w, busy);
  };

  // Sanity check (not timed): the bucketed sums are right.
  {
    auto out = strategy.run(
        [&](const std::vector<Tensor<float>>& g) {
          GradientBuckets<float> buckets(ReduceOp::SUM, bytes);
          for (const auto& t : g) buckets.push(t);
          return buckets.finish();
        },
        per_replica);
    for (int k = 0; k < kGradients; ++k) {
      const float expect = float(n * (n - 1) / 2 + n * k);
      const float* o = out[0][static_cast<std::size_t>(k)].data();
      if (o[0] != expect || o[numel - 1] != expect) {
        state.SkipWithError("GradientBuckets returned a wrong sum");
        return;
      }
    }
  }
  // Calibration: W from the median of a few communication-only runs.
  {
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = Clock::now();
      strategy.run(comm, per_replica);
      t.push_back(seconds(Clock::now() - t0));
    }
    w = compute_per_comm * median(t) / kGradients;
  }
  strategy.run(step, per_replica);  // warm-up

  double sum_step = 0, sum_compute = 0, sum_comm = 0;
  std::vector<double> paired;
  int64_t iters = 0;
  for (auto _ : state) {
    double t[3] = {0, 0, 0};  // step, compute, comm
    for (int k = 0; k < 3; ++k) {
      const int which = static_cast<int>((iters + k) % 3);
      const auto t0 = Clock::now();
      switch (which) {
        case 0: strategy.run(step, per_replica); break;
        case 1: strategy.run(compute_only); break;
        default: strategy.run(comm, per_replica); break;
      }
      t[which] = seconds(Clock::now() - t0);
    }
    state.SetIterationTime(t[0]);
    sum_step += t[0];
    sum_compute += t[1];
    sum_comm += t[2];
    paired.push_back(t[0] / std::max(t[1], t[2]));
    ++iters;
  }
  if (iters == 0) return;
  const double it = static_cast<double>(iters);
  state.counters["step_ms"] = sum_step / it * 1e3;
  state.counters["compute_ms"] = sum_compute / it * 1e3;
  state.counters["comm_ms"] = sum_comm / it * 1e3;
  state.counters["W_ms"] = w * 1e3;
  state.counters["ratio"] = sum_step / std::max(sum_compute, sum_comm);
  state.counters["ratio_med"] = median(paired);
  state.SetLabel("N=" + std::to_string(n) + " " + std::to_string(bytes >> 20) + "MiB x 8 " +
                 (busy ? "busy-loop" : "sleep") + " compute/comm=" + std::to_string(state.range(3)) + "%");
}

BENCHMARK(BM_Overlap)
    ->ArgNames({"replicas", "bytes", "busy", "compute_pct"})
    ->ArgsProduct({{2, 4}, {4 << 20}, {0, 1}, {100, 200}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
