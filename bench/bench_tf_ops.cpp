// The operations bench/tf_compare.py times with TensorFlow's MirroredStrategy, timed the same way
// with mirrored, on N ∈ {2, 4} CPU replicas:
//
//   BM_EmptyRun/replicas:N                 strategy.run of a function that does nothing
//   BM_ReplicaAllReduce/replicas:N/bytes:S strategy.run of a function whose replica-context
//                                          all_reduce(SUM) sums a float tensor of S bytes per
//                                          replica and returns the sum (a PerReplica, then dropped)
//   BM_Reduce/replicas:N/bytes:S           strategy.reduce(SUM, per_replica, std::nullopt): the sum
//                                          of the N replicas' S-byte tensors, on the host
//
// S is 64 MiB unless MIRRORED_TF_OPS_BYTES says otherwise (tf_compare.py --quick passes 4 MiB). The
// inputs are filled with r + 1 on replica r before timing, as on the TF side, and the results are
// checked once. Counter `ms`: mean wall milliseconds per operation (empty runs are timed in
// batches of 64, like the TF side, and the console's Time column is per batch). This benchmark has no anchor: its ratio
// is to TF, taken by tf_compare.py in the same run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
using mirrored::bench::strategy_for;
using Clock = std::chrono::steady_clock;

constexpr int kBatch = 64;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

mirrored::PerReplica<Tensor<float>> filled_inputs(MirroredStrategy& strategy, int64_t bytes) {
  const int64_t numel = bytes / static_cast<int64_t>(sizeof(float));
  return strategy.experimental_distribute_values_from_function([&](const mirrored::ValueContext& ctx) {
    return Tensor<float>::full({numel}, static_cast<float>(ctx.replica_id_in_sync_group + 1));
  });
}

bool all_equal(const Tensor<float>& t, float want) {
  const float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] != want) return false;
  return true;
}

void BM_EmptyRun(benchmark::State& state) {
  MirroredStrategy& strategy = strategy_for(static_cast<int>(state.range(0)));
  auto empty = [] {};
  for (int i = 0; i < kBatch; ++i) strategy.run(empty);  // warm-up
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kBatch; ++i) strategy.run(empty);
    const double t = seconds(Clock::now() - t0);
    state.SetIterationTime(t);  // the Time column is one batch; `ms` is per run
    total += t;
    ++iters;
  }
  if (iters > 0) state.counters["ms"] = total / static_cast<double>(iters * kBatch) * 1e3;
}

void BM_ReplicaAllReduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  MirroredStrategy& strategy = strategy_for(n);
  const auto x = filled_inputs(strategy, state.range(1));
  auto step = [](const Tensor<float>& v) { return mirrored::get_replica_context()->all_reduce(ReduceOp::SUM, v); };
  {
    const auto out = strategy.run(step, x);  // the check, and the warm-up
    for (int r = 0; r < n; ++r) {
      if (!all_equal(out[static_cast<std::size_t>(r)], static_cast<float>(n * (n + 1) / 2))) {
        state.SkipWithError("all_reduce returned a wrong sum");
        return;
      }
    }
  }
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    {
      const auto out = strategy.run(step, x);
      benchmark::DoNotOptimize(out);
    }
    const double t = seconds(Clock::now() - t0);
    state.SetIterationTime(t);
    total += t;
    ++iters;
  }
  if (iters > 0) state.counters["ms"] = total / static_cast<double>(iters) * 1e3;
}

void BM_Reduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  MirroredStrategy& strategy = strategy_for(n);
  const auto x = filled_inputs(strategy, state.range(1));
  if (!all_equal(strategy.reduce(ReduceOp::SUM, x, std::nullopt), static_cast<float>(n * (n + 1) / 2))) {
    state.SkipWithError("reduce returned a wrong sum");
    return;
  }
  double total = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    {
      const Tensor<float> sum = strategy.reduce(ReduceOp::SUM, x, std::nullopt);
      benchmark::DoNotOptimize(sum.data());
    }
    const double t = seconds(Clock::now() - t0);
    state.SetIterationTime(t);
    total += t;
    ++iters;
  }
  if (iters > 0) state.counters["ms"] = total / static_cast<double>(iters) * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t bytes = int64_t{64} << 20;
  if (const char* env = std::getenv("MIRRORED_TF_OPS_BYTES"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v < 4 || v % 4 != 0) {
      std::fprintf(stderr, "bench_tf_ops: MIRRORED_TF_OPS_BYTES=%s is not a positive multiple of 4\n", env);
      return 2;
    }
    bytes = v;
  }
  for (int n : {2, 4}) {
    benchmark::RegisterBenchmark("BM_EmptyRun", BM_EmptyRun)
        ->ArgName("replicas")
        ->Arg(n)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (auto* fn : {BM_ReplicaAllReduce, BM_Reduce}) {
    for (int n : {2, 4}) {
      benchmark::RegisterBenchmark(fn == BM_Reduce ? "BM_Reduce" : "BM_ReplicaAllReduce", fn)
          ->ArgNames({"replicas", "bytes"})
          ->Args({n, bytes})
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
