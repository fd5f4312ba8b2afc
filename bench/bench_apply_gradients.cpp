// apply_gradients of a 25 MB gradient set split into k tensors on N CPU replicas, against an
// anchor: one all-reduce of a single tensor of the same total bytes, measured in the same
// iteration on the same replica threads. Every ratio is printed beside its floor, the memory
// traffic the step must make in units of the anchor's:
//
//   anchor       all_reduce(SUM, one 25 MB tensor): reads N·S, writes N·S          (2N)
//   reduce_pk    all_reduce(SUM, std::vector of k tensors)   (what packing changes)
//   reduce_un    k calls of all_reduce(SUM, tensor)
//   sgd          SGD::apply_gradients: reads N gradients and one copy of w, writes N copies
//                of w                                                                (2N + 1)
//   sgd_un       the same, pack_gradients = false (one reduction per gradient)
//   adam         Adam::apply_gradients: also reads m and v once and writes N copies   (4N + 3)
//   adam_sh      Adam with shard_optimizer_state: reads and writes m and v once       (2N + 5)
//
// `*_floor` is that traffic over the anchor's; `*_vs_floor` the measured ratio over the floor
// (target <= 1.15). `adam_state` is the optimizer state one replica holds sharded over unsharded
// (target <= 0.26 at N = 4).
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored_strategy.hpp>
#include <mirrored/optimizers.hpp>
#include <mirrored/variable.hpp>

namespace {

using namespace mirrored;
using Clock = std::chrono::steady_clock;

constexpr int64_t kTotalFloats = 25'000'000 / 4;

double seconds_of(MirroredStrategy& s, const std::function<void()>& per_replica) {
  const auto t0 = Clock::now();
  s.run([&] { per_replica(); });
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void BM_ApplyGradients(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  std::vector<std::string> devices;
  for (int r = 0; r < n; ++r) devices.push_back("CPU:" + std::to_string(r));
  MirroredStrategy s(devices);
  std::vector<int64_t> sizes(k, kTotalFloats / k);
  sizes.back() += kTotalFloats - (kTotalFloats / k) * k;
  // One set of variables per optimizer, so that each keeps its own slots.
  auto make_vars = [&](const std::string& prefix) {
    std::vector<Variable<float>> vars;
    auto scope = s.scope();
    for (int i = 0; i < k; ++i)
      vars.emplace_back(Tensor<float>::zeros({sizes[i]}), VariableOptions{.name = prefix + std::to_string(i)});
    return vars;
  };
  const auto sgd_vars = make_vars("sgd"), sgd_un_vars = make_vars("sgd_un"), adam_vars = make_vars("adam"),
             adam_sh_vars = make_vars("adam_sh");
  // Per-replica gradients, made once.
  std::vector<std::vector<Tensor<float>>> grads(n);
  std::vector<Tensor<float>> whole(n);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < k; ++i) grads[r].push_back(Tensor<float>::full({sizes[i]}, 1e-6f, Device(DeviceType::CPU, r)));
    whole[r] = Tensor<float>::full({kTotalFloats}, 1e-6f, Device(DeviceType::CPU, r));
  }
  optimizers::SGD<> sgd({.learning_rate = 0.1}), sgd_un({.learning_rate = 0.1});
  sgd_un.pack_gradients = false;
  optimizers::Adam<> adam({.learning_rate = 0.1});
  optimizers::Adam<> adam_sh({.learning_rate = 0.1, .shard_optimizer_state = true});
  auto id = [] { return get_replica_context()->replica_id_in_sync_group(); };
  auto pairs = [&](const std::vector<Variable<float>>& vars, int r) {
    optimizers::GradsAndVars<float> gv;
    for (int i = 0; i < k; ++i) gv.emplace_back(grads[r][i], vars[i]);
    return gv;
  };
  double t[7] = {0, 0, 0, 0, 0, 0, 0};
  for (auto _ : state) {
    t[0] +=
        seconds_of(s, [&] { benchmark::DoNotOptimize(get_replica_context()->all_reduce(ReduceOp::SUM, whole[id()])); });
    t[1] +=
        seconds_of(s, [&] { benchmark::DoNotOptimize(get_replica_context()->all_reduce(ReduceOp::SUM, grads[id()])); });
    t[2] += seconds_of(s, [&] {
      for (const auto& g : grads[id()]) benchmark::DoNotOptimize(get_replica_context()->all_reduce(ReduceOp::SUM, g));
    });
    const double step = seconds_of(s, [&] { sgd.apply_gradients(pairs(sgd_vars, id())); });
    t[3] += step;
    t[4] += seconds_of(s, [&] { sgd_un.apply_gradients(pairs(sgd_un_vars, id())); });
    t[5] += seconds_of(s, [&] { adam.apply_gradients(pairs(adam_vars, id())); });
    t[6] += seconds_of(s, [&] { adam_sh.apply_gradients(pairs(adam_sh_vars, id())); });
    state.SetIterationTime(step);
  }
  const double two_n = 2.0 * n;
  const double floors[7] = {
      1, 1, 1, (two_n + 1) / two_n, (two_n + 1) / two_n, (4.0 * n + 3) / two_n, (two_n + 5) / two_n};
  const char* names[7] = {"anchor", "reduce_pk", "reduce_un", "sgd", "sgd_un", "adam", "adam_sh"};
  state.counters["anchor_ms"] = 1e3 * t[0] / static_cast<double>(state.iterations());
  for (int i = 1; i < 7; ++i) {
    state.counters[names[i]] = t[i] / t[0];
    if (i >= 3) {
      state.counters[std::string(names[i]) + "_floor"] = floors[i];
      state.counters[std::string(names[i]) + "_vs_floor"] = t[i] / t[0] / floors[i];
    }
  }
  state.counters["adam_state"] = static_cast<double>(adam_sh.state_bytes_per_replica()[0]) /
                                 static_cast<double>(adam.state_bytes_per_replica()[0]);
}

BENCHMARK(BM_ApplyGradients)
    ->ArgNames({"replicas", "tensors"})
    ->Args({2, 100})
    ->Args({4, 100})
    ->Args({2, 10})
    ->Args({2, 1000})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
