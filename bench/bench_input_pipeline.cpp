// Distributed input (`Strategy::experimental_distribute_dataset`), reported as ratios to anchors
// measured in the same process, interleaved with the measured operation.
//
// BM_DistributedThroughput/replicas:N/bytes:S
//   dist:    64 steps from a running distributed iterator (steady state) over an endless dataset
//            whose elements are global batches of S bytes (float, 256 rows) taken from a pool of
//            4 pre-made tensors (the dataset itself copies nothing); each step the iterator's
//            background thread cuts the batch into N row slices and copies each to its replica's
//            device (CPU:r: host memory). The caller takes every step with get_next() and drops
//            it. (While the anchor runs, the thread can prepare at most 2 steps ahead: <= 3 %.)
//   anchor:  a plain loop doing the same copies on the calling thread: per step and replica,
//            allocate a slice tensor on the replica's device and memcpy its rows into it.
//   Counters: dist_us, anchor_us (per step), ratio = anchor_us / dist_us (target >= 0.8 at
//            1 MiB), ratio_med (median of the paired per-iteration ratios), dist_GBps, and
//            start_us: median time from begin() of a fresh pass to its first step (thread start
//            and the first batch, paid once per epoch).
//
// BM_PrefetchOverlap/work_us:D/io:M
//   Every step needs D µs of input preparation (inside the dataset's map function) and a
//   strategy.run whose replica function takes D µs. M = 0: both are CPU work (a calibrated loop;
//   1 replica, so input thread + replica thread need 2 cores); M = 1: the input waits (sleeps,
//   like I/O) and the compute is CPU work on 2 replicas.
//   input:   the distributed dataset iterated alone, without prefetching (buffer 0), no run.
//   compute: strategy.run alone on a ready PerReplica.
//   serial:  get_next + run per step without prefetching (buffer 0): ≈ input + compute.
//   step:    get_next + run per step with the default per-replica buffer (1): the next step
//            is prepared while the current one runs, so ≈ max(input, compute).
//   Counters (ms per step): step_ms (also the manual time), input_ms, compute_ms, serial_ms;
//   ratio_max = step / max(input, compute) (1.0 = input fully hidden), ratio_sum =
//   step / (input + compute) (0.5 when both are equal and fully overlapped), hidden =
//   (serial - step) / min(input, compute) (share of the smaller cost that was hidden).
//
// BM_IteratorRestore/elements:K/buffer:B
//   An iterator of range(2K).shuffle(B, 7).batch(64).prefetch(2) positioned after the batches
//   holding its first K elements (K = 10^6: 15625 batches), in a fresh dataset each time:
//   restore: begin() and restore_state(saved state) (the state holds the shuffle buffer, the
//            prefetched batches and the positions, no replay).
//   anchor:  replay: begin() and next() up to the same position.
//   Both then take the next batch, which must be the same (else the case fails).
//   Counters: restore_ms (also the manual time), replay_ms, save_ms (save_state of the running
//   iterator), state_KiB, ratio = replay_ms / restore_ms (how much faster a restore is).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mirrored/mirrored.hpp>

#include <string>
#include <thread>
#include <vector>
#include "bench_util.hpp"

namespace {

using namespace mirrored;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 64;
constexpr int kPool = 4;
constexpr int64_t kRows = 256;

using mirrored::bench::strategy_for;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::vector<Tensor<float>> make_pool(int64_t bytes) {
  const int64_t cols = std::max<int64_t>(1, bytes / static_cast<int64_t>(sizeof(float)) / kRows);
  std::vector<Tensor<float>> pool;
  for (int i = 0; i < kPool; ++i) pool.push_back(Tensor<float>::full({kRows, cols}, float(i + 1)));
  return pool;
}

// kSteps steps from a running iterator (steady state: its thread is up, its buffer warm).
template <class E>
double time_steps(DistributedIterator<E>& it, float& sink) {
  const auto t0 = Clock::now();
  for (int s = 0; s < kSteps; ++s) {
    PerReplica<E> step = it.get_next();
    sink += step[step.size() - 1].data()[0];
  }
  return seconds(Clock::now() - t0);
}

// Median time from begin() to the first step of a fresh pass (thread start, first batch).
template <class E>
double time_start(const DistributedDataset<E>& dist, float& sink) {
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = Clock::now();
    auto it = dist.begin();
    sink += it.get_next()[0].data()[0];
    t.push_back(seconds(Clock::now() - t0));
  }
  return median(t);
}

double time_anchor(const std::vector<Tensor<float>>& pool, const std::vector<Device>& devices, float& sink) {
  const std::size_t n = devices.size();
  const auto t0 = Clock::now();
  for (int s = 0; s < kSteps; ++s) {
    const Tensor<float>& src = pool[static_cast<std::size_t>(s % kPool)];
    const int64_t rows = src.shape()[0] / static_cast<int64_t>(n), cols = src.shape()[1];
    std::vector<Tensor<float>> step;
    for (std::size_t r = 0; r < n; ++r) {
      Tensor<float> t = Tensor<float>::empty({rows, cols}, devices[r]);
      std::memcpy(t.data(), src.data() + static_cast<int64_t>(r) * rows * cols, t.bytes());
      step.push_back(std::move(t));
    }
    sink += step.back().data()[0];
  }
  return seconds(Clock::now() - t0);
}

void BM_DistributedThroughput(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  MirroredStrategy& strategy = strategy_for(n);
  const std::vector<Tensor<float>> pool = make_pool(bytes);
  auto ds =
      data::range(kPool).map([pool](const Tensor<int64_t>& i) { return pool[static_cast<std::size_t>(i.item())]; });
  auto dist = strategy.experimental_distribute_dataset(ds.repeat());
  const auto& devices = strategy.extended().worker_devices();

  float sink = 0;
  const double start_s = time_start(dist, sink);
  auto it = dist.begin();
  time_steps(it, sink);  // warm up allocators and threads
  time_anchor(pool, devices, sink);
  double dist_s = 0, anchor_s = 0;
  std::vector<double> ratios;
  bool dist_first = true;
  for (auto _ : state) {
    double d, a;
    if (dist_first) {
      d = time_steps(it, sink);
      a = time_anchor(pool, devices, sink);
    } else {
      a = time_anchor(pool, devices, sink);
      d = time_steps(it, sink);
    }
    dist_first = !dist_first;
    dist_s += d;
    anchor_s += a;
    ratios.push_back(a / d);
    state.SetIterationTime(d);
  }
  benchmark::DoNotOptimize(sink);
  const double steps = double(kSteps) * double(state.iterations());
  state.counters["dist_us"] = dist_s / steps * 1e6;
  state.counters["anchor_us"] = anchor_s / steps * 1e6;
  state.counters["ratio"] = anchor_s / dist_s;
  state.counters["ratio_med"] = median(ratios);
  state.counters["dist_GBps"] = double(pool[0].bytes()) * steps / dist_s / 1e9;
  state.counters["start_us"] = start_s * 1e6;
}

BENCHMARK(BM_DistributedThroughput)
    ->ArgNames({"replicas", "bytes"})
    ->Args({2, 64 << 10})
    ->Args({2, 1 << 20})
    ->Args({4, 1 << 20})
    ->Args({2, 8 << 20})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- overlap ---------------------------------------------------------------------------------

constexpr int kOverlapSteps = 20;

// Iterations of `work` per microsecond on one core, measured once.
double loops_per_us() {
  static const double value = [] {
    double x = 1.0;
    const auto t0 = Clock::now();
    const int64_t n = 20'000'000;
    for (int64_t i = 0; i < n; ++i) {
      x = x * 1.0000001 + 1e-9;
      benchmark::DoNotOptimize(x);
    }
    return double(n) / (seconds(Clock::now() - t0) * 1e6);
  }();
  return value;
}

// About `us` microseconds of CPU work on an otherwise idle core.
void work(int64_t us) {
  double x = 1.0;
  const auto n = static_cast<int64_t>(double(us) * loops_per_us());
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1.0000001 + 1e-9;
    benchmark::DoNotOptimize(x);
  }
}

void BM_PrefetchOverlap(benchmark::State& state) {
  const int64_t us = state.range(0);
  const bool io = state.range(1) != 0;
  const int n = io ? 2 : 1;
  MirroredStrategy& strategy = strategy_for(n);
  loops_per_us();
  const Tensor<float> batch = Tensor<float>::full({8, 16}, 1.0f);
  auto ds = data::range(kOverlapSteps).map([batch, us, io](const Tensor<int64_t>&) {
    if (io)
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    else
      work(us);
    return batch;
  });
  InputOptions serial_options;
  serial_options.experimental_per_replica_buffer_size = 0;
  auto serial = strategy.experimental_distribute_dataset(ds, serial_options);
  auto prefetched = strategy.experimental_distribute_dataset(ds);
  auto replica_fn = [us](const Tensor<float>& x) {
    work(us);
    return x.numel();
  };
  const auto ready = *serial.begin();

  auto time_steps = [&](const DistributedDataset<Tensor<float>>& dist, bool run) {
    const auto t0 = Clock::now();
    auto it = dist.begin();
    while (auto step = it.get_next_as_optional())
      if (run) benchmark::DoNotOptimize(strategy.run(replica_fn, *step));
    return seconds(Clock::now() - t0) / kOverlapSteps;
  };
  auto time_compute = [&] {
    const auto t0 = Clock::now();
    for (int s = 0; s < kOverlapSteps; ++s) benchmark::DoNotOptimize(strategy.run(replica_fn, ready));
    return seconds(Clock::now() - t0) / kOverlapSteps;
  };

  double in = 0, c = 0, ser = 0, step = 0;
  for (auto _ : state) {
    in += time_steps(serial, false);
    c += time_compute();
    ser += time_steps(serial, true);
    const double s = time_steps(prefetched, true);
    step += s;
    state.SetIterationTime(s * kOverlapSteps);
  }
  const double k = double(state.iterations());
  in /= k, c /= k, ser /= k, step /= k;
  state.counters["step_ms"] = step * 1e3;
  state.counters["input_ms"] = in * 1e3;
  state.counters["compute_ms"] = c * 1e3;
  state.counters["serial_ms"] = ser * 1e3;
  state.counters["ratio_max"] = step / std::max(in, c);
  state.counters["ratio_sum"] = step / (in + c);
  state.counters["hidden"] = (ser - step) / std::min(in, c);
}

BENCHMARK(BM_PrefetchOverlap)
    ->ArgNames({"work_us", "io"})
    ->Args({2000, 0})
    ->Args({2000, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- iterator state ------------------------------------------------------------------------

constexpr int64_t kRestoreBatch = 64;

data::Dataset<Tensor<int64_t>> restore_pipeline(int64_t elements, int64_t buffer) {
  return data::range(2 * elements).shuffle(buffer, 7).batch(kRestoreBatch).prefetch(2);
}

void BM_IteratorRestore(benchmark::State& state) {
  const int64_t elements = state.range(0), buffer = state.range(1);
  const int64_t batches = elements / kRestoreBatch;
  std::string saved;
  double save_s = 0;
  {
    const auto ds = restore_pipeline(elements, buffer);
    auto it = ds.begin();
    for (int64_t i = 0; i < batches; ++i) it.next();
    const auto t0 = Clock::now();
    saved = it.save_state();
    save_s = seconds(Clock::now() - t0);
  }
  double restore_s = 0, replay_s = 0;
  bool restore_first = true;
  const auto restore = [&] {
    const auto ds = restore_pipeline(elements, buffer);
    const auto t0 = Clock::now();
    auto it = ds.begin();
    it.restore_state(saved);
    std::vector<int64_t> next = it.next()->to_vector();
    return std::make_pair(seconds(Clock::now() - t0), next);
  };
  const auto replay = [&] {
    const auto ds = restore_pipeline(elements, buffer);
    const auto t0 = Clock::now();
    auto it = ds.begin();
    for (int64_t i = 0; i < batches; ++i) it.next();
    std::vector<int64_t> next = it.next()->to_vector();
    return std::make_pair(seconds(Clock::now() - t0), next);
  };
  for (auto _ : state) {
    std::pair<double, std::vector<int64_t>> a, b;
    if (restore_first) {
      a = restore();
      b = replay();
    } else {
      b = replay();
      a = restore();
    }
    restore_first = !restore_first;
    if (a.second != b.second) {
      state.SkipWithError("the restored iterator's next batch differs from the replayed one");
      break;
    }
    restore_s += a.first;
    replay_s += b.first;
    state.SetIterationTime(a.first);
  }
  const double n = double(state.iterations());
  state.counters["restore_ms"] = restore_s / n * 1e3;
  state.counters["replay_ms"] = replay_s / n * 1e3;
  state.counters["save_ms"] = save_s * 1e3;
  state.counters["state_KiB"] = double(saved.size()) / 1024.0;
  state.counters["ratio"] = replay_s / restore_s;
}

BENCHMARK(BM_IteratorRestore)
    ->ArgNames({"elements", "buffer"})
    ->Args({1000000, 1000})
    ->Args({1000000, 10000})
    ->Iterations(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
