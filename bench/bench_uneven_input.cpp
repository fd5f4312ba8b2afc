// One worker of a job started by tools/launch.sh (several processes, not a google benchmark): the
// per-step cost of the end-of-input agreement of distributed iterators across workers (uneven
// input, docs/data.md). The chief prints microseconds per step of, each the median of `rounds`
// rounds of `steps` steps, started together:
//
//   loop-empty      a pass of a distributed dataset whose steps run an empty replica function,
//                   with the agreement (what Strategy::experimental_distribute_dataset makes)
//   loop-empty-bare the same pass without it (the internal entry point, given no agreement)
//   loop-ar         as loop-empty, each step all-reducing one float (a minimal training step)
//   loop-ar-bare    the same without the agreement
//   exchange        the agreement alone (count_workers_with_input)
//   all-reduce      the anchor: an all-reduce of one float inside run
//
//   tools/launch.sh 2 -- build/release/bench_workers/bench_uneven_input [--steps 2000] [--rounds 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace {

using namespace mirrored;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 2000, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    if (flag == "--rounds") rounds = std::stoi(argv[i + 1]);
  }
  try {
    MultiWorkerMirroredStrategy s(CommunicationOptions{}, nullptr, {"CPU:0"});
    const int W = s.extended().num_workers(), w = s.extended().worker_index();
    const auto together = [&] { s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt); };
    // Every worker has `steps` steps of one row each (DATA sharding of global batches of W rows).
    const auto ds = data::range(int64_t{W} * steps).batch(W);
    const auto agreed = s.experimental_distribute_dataset(ds);
    const auto bare = data::detail::distribute_dataset(ds, s.extended().worker_devices(), W, w, InputOptions{});
    const auto empty_step = [](const Tensor<int64_t>&) {};
    const auto ar_step = [](const Tensor<int64_t>&) { get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); };
    // Microseconds per step of a timed body making `steps` steps.
    const auto time = [&](const std::function<void()>& body) {
      std::vector<double> us;
      body();  // warm-up
      for (int r = 0; r < rounds; ++r) {
        together();
        const auto start = Clock::now();
        body();
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / steps);
      }
      return median(us);
    };
    const auto loop = [&](const DistributedDataset<Tensor<int64_t>>& dd, auto fn) {
      return [&, fn] {
        int n = 0;
        for (const auto& step : dd) {
          s.run(fn, step);
          ++n;
        }
        if (n != steps) std::fprintf(stderr, "bench_uneven_input: %d steps, expected %d\n", n, steps);
      };
    };
    const double loop_empty = time(loop(agreed, empty_step));
    const double loop_empty_bare = time(loop(bare, empty_step));
    const double loop_ar = time(loop(agreed, ar_step));
    const double loop_ar_bare = time(loop(bare, ar_step));
    const double exchange = time([&] {
      for (int i = 0; i < steps; ++i) detail::count_workers_with_input(s, true);
    });
    const double all_reduce = time([&] {
      for (int i = 0; i < steps; ++i) s.run([] { get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
    });
    if (w == 0) {
      std::printf("uneven-input %d workers, %d steps, median of %d rounds (us per step):\n", W, steps, rounds);
      std::printf("  loop-empty %.2f  loop-empty-bare %.2f  (agreement adds %.2f)\n", loop_empty, loop_empty_bare,
                  loop_empty - loop_empty_bare);
      std::printf("  loop-ar %.2f  loop-ar-bare %.2f  (agreement adds %.2f, x%.2f)\n", loop_ar, loop_ar_bare,
                  loop_ar - loop_ar_bare, loop_ar / loop_ar_bare);
      std::printf("  exchange %.2f  all-reduce %.2f  (exchange / all-reduce %.2f)\n", exchange, all_reduce,
                  exchange / all_reduce);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_uneven_input: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
