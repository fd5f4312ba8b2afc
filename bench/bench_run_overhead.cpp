// Cost of `strategy.run` with an empty replica function, reported as a ratio to a bare
// std::barrier round trip with the same number of threads, measured in the same process.
//
//   run:      MirroredStrategy on N CPU replicas, strategy.run([] {}).
//   barrier:  N worker threads + the calling thread on one std::barrier<>; one round trip is two
//             arrive_and_wait per thread (dispatch, then completion), which is what a run needs
//             at least: hand the work out, learn that every replica is done.
//
// Each benchmark iteration times a batch of `kBatch` runs and a batch of `kBatch` barrier round
// trips (order alternating per iteration), with steady_clock and with the process CPU clock
// (CLOCK_PROCESS_CPUTIME_ID: every thread of the process, so spinning replicas show up; Google
// Benchmark's own CPU column is the calling thread only). Manual time = the batch of runs, so
// the Time column is per 64 runs; read the per-call counters instead:
//   run_us, barrier_us           wall µs per run / per barrier round trip
//   ratio                        run_us / barrier_us (target <= 3)
//   ratio_med                    median over iterations of (run batch / barrier batch) of the
//                                same iteration: paired, so robust to load that comes and goes
//   run_cpu_us, barrier_cpu_us   process CPU µs per run / per round trip
//   run_cores                    run_cpu_us / run_us: how many cores a run keeps busy on average
//                                (with more replicas than cores, values near the core count while
//                                the run itself gets slower mean spinning rather than sleeping)
//   idle_cores                   process CPU / wall over 50 ms with nothing running, after the
//                                loop: ~0 unless idle replica threads (or barrier threads) spin
//
// BM_TimelineOverhead: the same empty runs with the timeline (<mirrored/timeline.hpp>) off and on,
// paired in each iteration: a batch of kTimelineBatch runs with it off, then `timeline::start` into a
// temporary file and 4 runs that set up each thread's buffer (not timed), a batch with it on (every
// replica records its "run" event), then `timeline::stop` (timed separately: it formats and writes the
// batch's events, work the writer thread does in the background of a long recording).
//   off_us, on_us                wall µs per run without / with the timeline
//   overhead, overhead_med       on_us / off_us - 1, and the median over iterations of the paired
//                                ratio - 1 (the target is <= 0.05)
//   write_us                     `stop` (format, write, close) per run of the batch
//
// BM_FlightRecorderOverhead: the flight recorder (docs/api.md §15) on against off, in one process: one
// strategy of N CPU replicas whose rings are paused and resumed between batches (a private switch);
// each iteration times a batch with and one without (order alternating), of empty runs
// (bytes = 0) or of runs making one 64 KiB all-reduce each (bytes = 65536).
//   off_us, on_us                wall µs per run without / with the recorder
//   overhead, overhead_med       on_us / off_us - 1, and the median over iterations of the paired
//                                ratio - 1 (the target is within ±0.01)
//   overhead_lo, overhead_hi     a 95 % confidence interval of overhead_med (order statistics)
//   call_ns, call_share          (64 KiB) one recorded collective timed alone in the same run, and
//                                its share of a run without the recorder: the recorder's own work
// BM_FlightCall: one recorded collective alone (issue, enter, end on one ring; private API), ns.
#include <benchmark/benchmark.h>

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>
#include <mirrored/timeline.hpp>

#include "bench_util.hpp"
#include "collectives/flight_recorder.hpp"

namespace {

using mirrored::MirroredStrategy;
using Clock = std::chrono::steady_clock;

constexpr int kBatch = 64;
// The timeline's batches are longer: each one follows a `timeline::start` or `stop` (a thread
// started or joined, a file written), whose after-effects on the caches and the scheduler are not
// the per-run cost being measured. 64 runs of an empty 1-replica step last ~130 us, about as
// long as those after-effects; 1024 runs last ~2 ms.
constexpr int kTimelineBatch = 1024;

using mirrored::bench::strategy_for;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// N workers + the caller on one barrier; round_trip() = dispatch + completion, like run.
class BarrierPool {
 public:
  explicit BarrierPool(int n) : barrier_(n + 1) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        while (true) {
          barrier_.arrive_and_wait();  // dispatch
          if (stop_.load(std::memory_order_relaxed)) return;
          barrier_.arrive_and_wait();  // completion
        }
      });
    }
  }
  ~BarrierPool() {
    stop_.store(true, std::memory_order_relaxed);
    barrier_.arrive_and_wait();  // workers see stop_ after this phase and leave
    for (auto& t : threads_) t.join();
  }
  void round_trip() {
    barrier_.arrive_and_wait();
    barrier_.arrive_and_wait();
  }

 private:
  std::barrier<> barrier_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

void BM_RunOverhead(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  MirroredStrategy& strategy = strategy_for(n);
  BarrierPool barrier(n);
  auto empty = [] {};

  for (int i = 0; i < kBatch; ++i) strategy.run(empty);  // warm-up
  for (int i = 0; i < kBatch; ++i) barrier.round_trip();

  double run_wall = 0, run_cpu = 0, bar_wall = 0, bar_cpu = 0;
  std::vector<double> paired;  // run batch / barrier batch, per iteration
  int64_t iters = 0;
  for (auto _ : state) {
    double t_run = 0, t_bar = 0;
    for (int k = 0; k < 2; ++k) {
      const bool do_run = ((iters + k) % 2) == 0;
      const double c0 = process_cpu_seconds();
      const auto t0 = Clock::now();
      if (do_run) {
        for (int i = 0; i < kBatch; ++i) strategy.run(empty);
      } else {
        for (int i = 0; i < kBatch; ++i) barrier.round_trip();
      }
      const double wall = seconds(Clock::now() - t0);
      const double cpu = process_cpu_seconds() - c0;
      if (do_run) {
        t_run = wall;
        run_wall += wall;
        run_cpu += cpu;
      } else {
        t_bar = wall;
        bar_wall += wall;
        bar_cpu += cpu;
      }
    }
    paired.push_back(t_run / t_bar);
    state.SetIterationTime(t_run);  // the Time column is one batch of kBatch runs; see run_us
    ++iters;
  }
  // Idle check (not timed): after the last run every thread must block, not spin.
  const double idle_c0 = process_cpu_seconds();
  const auto idle_t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double idle_cores = (process_cpu_seconds() - idle_c0) / seconds(Clock::now() - idle_t0);
  if (iters == 0) return;
  const double calls = static_cast<double>(iters) * kBatch;
  state.counters["run_us"] = run_wall / calls * 1e6;
  state.counters["barrier_us"] = bar_wall / calls * 1e6;
  state.counters["ratio"] = run_wall / bar_wall;
  state.counters["ratio_med"] = median(paired);
  state.counters["run_cpu_us"] = run_cpu / calls * 1e6;
  state.counters["barrier_cpu_us"] = bar_cpu / calls * 1e6;
  state.counters["run_cores"] = run_cpu / run_wall;
  state.counters["idle_cores"] = idle_cores;
  state.SetLabel("N=" + std::to_string(n));
}

BENCHMARK(BM_RunOverhead)
    ->ArgName("replicas")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_TimelineOverhead(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  MirroredStrategy& strategy = strategy_for(n);
  auto empty = [] {};
  char dir[] = "/tmp/mirrored_bench_timeline_XXXXXX";
  if (!mkdtemp(dir)) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string path = std::string(dir) + "/timeline.json";
  for (int i = 0; i < kTimelineBatch; ++i) strategy.run(empty);  // warm-up

  double off_wall = 0, on_wall = 0, write_wall = 0;
  std::vector<double> paired;  // on batch / off batch, per iteration
  int64_t iters = 0;
  for (auto _ : state) {
    double off = 0, on = 0;
    for (int k = 0; k < 2; ++k) {
      const bool with_timeline = ((iters + k) % 2) == 0;  // the order alternates per iteration
      if (with_timeline) mirrored::timeline::start(path);
      // Not timed: each thread's first event of a timeline sets up its buffer, once per recording.
      // Both arms run them, so that neither starts its batch straight after a `start` or `stop`.
      for (int i = 0; i < 4; ++i) strategy.run(empty);
      const auto t0 = Clock::now();
      for (int i = 0; i < kTimelineBatch; ++i) strategy.run(empty);
      (with_timeline ? on : off) = seconds(Clock::now() - t0);
      if (with_timeline) {
        const auto w0 = Clock::now();
        mirrored::timeline::stop();
        write_wall += seconds(Clock::now() - w0);
      }
    }
    off_wall += off;
    on_wall += on;
    paired.push_back(on / off);
    state.SetIterationTime(on);
    ++iters;
  }
  unlink(path.c_str());
  rmdir(dir);
  if (iters == 0) return;
  const double calls = static_cast<double>(iters) * kTimelineBatch;
  state.counters["off_us"] = off_wall / calls * 1e6;
  state.counters["on_us"] = on_wall / calls * 1e6;
  state.counters["overhead"] = on_wall / off_wall - 1;
  state.counters["overhead_med"] = median(paired) - 1;
  state.counters["write_us"] = write_wall / calls * 1e6;
  state.SetLabel("N=" + std::to_string(n));
}

BENCHMARK(BM_TimelineOverhead)
    ->ArgName("replicas")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

constexpr int kFlightBatch = 64;

void BM_FlightRecorderOverhead(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  std::vector<std::string> devices;
  for (int r = 0; r < n; ++r) devices.push_back("CPU:" + std::to_string(r));
  // One strategy, its rings paused and resumed between batches: the same threads, buffers and
  // caches on both sides (two strategies, one made with the recorder off, differed by a few
  // percent even in empty runs, where the recorder records nothing).
  MirroredStrategy strategy(devices);
  const auto value = mirrored::Tensor<float>::full({bytes / static_cast<int64_t>(sizeof(float))}, 1.0f);
  auto batch = [&](bool recording) {
    mirrored::detail::set_flight_recording(recording);
    MirroredStrategy& s = strategy;
    const auto t0 = Clock::now();
    for (int i = 0; i < kFlightBatch; ++i) {
      if (bytes == 0)
        s.run([] {});
      else
        s.run([&] {
          benchmark::DoNotOptimize(mirrored::get_replica_context()->all_reduce(mirrored::ReduceOp::SUM, value));
        });
    }
    return seconds(Clock::now() - t0);
  };
  batch(false);  // warm-up: threads started, pools filled
  batch(true);
  double off_wall = 0, on_wall = 0;
  std::vector<double> paired;
  int64_t iters = 0;
  for (auto _ : state) {
    double t_off = 0, t_on = 0;
    if (iters % 2 == 0) {
      t_off = batch(false);
      t_on = batch(true);
    } else {
      t_on = batch(true);
      t_off = batch(false);
    }
    off_wall += t_off;
    on_wall += t_on;
    paired.push_back(t_on / t_off);
    state.SetIterationTime(t_on);
    ++iters;
  }
  if (iters == 0) return;
  const double calls = static_cast<double>(iters) * kFlightBatch;
  state.counters["off_us"] = off_wall / calls * 1e6;
  state.counters["on_us"] = on_wall / calls * 1e6;
  state.counters["overhead"] = on_wall / off_wall - 1;
  state.counters["overhead_med"] = median(paired) - 1;
  // A 95 % confidence interval of that median, distribution-free: the order statistics at
  // n/2 -+ 0.98 sqrt(n) (the binomial(n, 1/2) quantiles, normal approximation).
  std::sort(paired.begin(), paired.end());
  const double half = 0.98 * std::sqrt(static_cast<double>(paired.size()));
  const auto rank = [&](double r) {
    return paired[static_cast<std::size_t>(std::clamp(r, 0.0, static_cast<double>(paired.size() - 1)))];
  };
  state.counters["overhead_lo"] = rank(std::floor(paired.size() / 2.0 - half)) - 1;
  state.counters["overhead_hi"] = rank(std::ceil(paired.size() / 2.0 + half)) - 1;
  // What the recorder's own work is of a run: one recorded collective per run (none in an empty
  // one), timed alone on a ring here, against the run without the recorder.
  if (bytes) {
    mirrored::detail::FlightRing ring(256);
    const std::vector<int64_t> shape{bytes / static_cast<int64_t>(sizeof(float))};
    const auto deadline = mirrored::Deadline::after(60);  // made by every call anyway
    constexpr int kCalls = 200000;
    const auto t0 = Clock::now();
    for (int i = 0; i < kCalls; ++i) {
      mirrored::detail::FlightCall call(ring, deadline, mirrored::detail::CollectiveKind::all_reduce, 0, 0, &shape,
                                        bytes, false);
      call.done();
    }
    const double call_s = seconds(Clock::now() - t0) / kCalls;
    benchmark::DoNotOptimize(ring.next_seq());
    state.counters["call_ns"] = call_s * 1e9;
    state.counters["call_share"] = call_s / (off_wall / calls);
  }
  state.SetLabel("N=" + std::to_string(n) + (bytes ? " all_reduce 64KiB" : " empty run"));
}

BENCHMARK(BM_FlightRecorderOverhead)
    ->ArgNames({"replicas", "bytes"})
    ->ArgsProduct({{1, 2, 4}, {0, 64 << 10}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_FlightCall(benchmark::State& state) {
  mirrored::detail::FlightRing ring(256);
  const std::vector<int64_t> shape{16384};
  const auto deadline = mirrored::Deadline::after(60);  // made by every call anyway
  for (auto _ : state) {
    mirrored::detail::FlightCall call(ring, deadline, mirrored::detail::CollectiveKind::all_reduce, 0, 0, &shape, 65536,
                                      false);
    call.done();
  }
  benchmark::DoNotOptimize(ring.next_seq());
}

BENCHMARK(BM_FlightCall)->Unit(benchmark::kNanosecond);

}  // namespace

BENCHMARK_MAIN();
