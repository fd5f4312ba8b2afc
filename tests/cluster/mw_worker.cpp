// One worker of the multi-worker tests: started (by tests/cluster/process_harness.hpp or
// tools/launch.sh) with a TF_CONFIG, or with a launcher's variables (cluster_resolver_from_environment),
// it runs a scenario and checks exact values. Exit status: 0
// when every check passed, 1 when one failed (printing it), 3 when the scenario's expected error
// did not come.
//
//   mirrored_mw_worker <scenario> [--replicas R] [--timeout S] [--victim K] [--step N] [--implementation auto|ring]
//                      [--gpus 1]  (compression: replicas and their inputs on GPU:0..R-1)
//
// Scenarios: collectives, ring (all-reduces of uneven sizes), compression (mw_compression.cpp), mismatch, kill
// (worker K kills itself at step N), stop (worker K stops itself), never_join (expects the start-up to fail),
// leave_early (worker K leaves after N steps), checkpoint (mw_checkpoint.cpp; needs $MW_CHECKPOINT_DIR),
// big (N all-reduces of --elements floats, each timed: slow links must not look like lost peers),
// agreement_loop (mw_uneven.cpp: steps of a distributed dataset until a fault from outside ends them),
// uneven (mw_uneven.cpp: uneven input ends together), uneven_failure (worker K's input pipeline throws at
// step N), uneven_mismatch (worker 0 takes a step while the others all-reduce), default_devices (the
// devices a worker takes when given none, printed, and an all-reduce on them), hello (prints and exits).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "mw_worker.hpp"

namespace {

using namespace mirrored;
using namespace mirrored::mw;
using Clock = std::chrono::steady_clock;

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::cerr << "usage: mirrored_mw_worker <scenario> [--replicas R] [--timeout S] [--victim K] [--step N] "
                 "[--implementation auto|ring] [--elements N]\n";
    std::exit(2);
  }
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], v = argv[i + 1];
    if (flag == "--replicas")
      a.replicas = std::stoi(v);
    else if (flag == "--timeout")
      a.timeout = std::stod(v);
    else if (flag == "--victim")
      a.victim = std::stoi(v);
    else if (flag == "--step")
      a.step = std::stoi(v);
    else if (flag == "--implementation")
      a.implementation = v;
    else if (flag == "--gpus")
      a.gpus = v == "1";
    else if (flag == "--elements")
      a.elements = std::stoll(v);
  }
  return a;
}

// ---------------------------------------------------------------------------------------------

void check_collectives(MultiWorkerMirroredStrategy& s) {
  const int W = s.extended().num_workers();
  const int rank = s.extended().worker_index();
  const int R = static_cast<int>(s.extended().worker_devices().size());
  const int N = W * R;
  CHECK(s.num_replicas_in_sync() == N, s.num_replicas_in_sync());
  CHECK(s.extended().should_checkpoint() == (rank == 0), "");
  CHECK(s.extended().worker_devices()[0].to_string() ==
            detail::str_cat("/job:worker/replica:0/task:", rank, "/device:CPU:0"),
        s.extended().worker_devices()[0].to_string());

  // Global replica ids.
  auto ids = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return std::make_pair(c.replica_id_in_sync_group, c.num_replicas_in_sync); });
  for (int r = 0; r < R; ++r) CHECK(ids[r] == std::make_pair(rank * R + r, N), ids[r].first);
  auto run_ids = s.run([] { return get_replica_context()->replica_id_in_sync_group(); });
  for (int r = 0; r < R; ++r) CHECK(run_ids[r] == rank * R + r, run_ids[r]);

  // all_reduce: SUM and MEAN of tensors, numbers and nests; integers.
  const float sum_g1 = static_cast<float>(N * (N + 1) / 2);  // sum over g of (g + 1)
  auto reduced = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    auto t = ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({3}, static_cast<float>(g + 1)));
    auto m = ctx->all_reduce(ReduceOp::MEAN, Tensor<double>::full({2}, 2.0 * (g + 1)));
    auto i = ctx->all_reduce(ReduceOp::SUM, Tensor<int32_t>{g, 1});
    auto nest = ctx->all_reduce(ReduceOp::SUM, std::make_tuple(Tensor<float>::scalar(1.0f), int64_t{g}));
    // The 2-byte floats cross workers too (as halves, summed in float and rounded once).
    auto h = ctx->all_reduce(ReduceOp::SUM, Tensor<float16>::full({5}, float16(static_cast<float>(g + 1))));
    auto b = ctx->all_reduce(ReduceOp::MEAN, Tensor<bfloat16>::full({3}, bfloat16(2.0f * (g + 1))));
    return std::make_tuple(t.to_vector(), m.to_vector(), i.to_vector(), std::get<0>(nest).item(), std::get<1>(nest),
                           static_cast<float>(h.to_vector()[4]), static_cast<float>(b.to_vector()[2]));
  });
  for (int r = 0; r < R; ++r) {
    const auto& [t, m, i, one, gs, h, b] = reduced[r];
    CHECK(h == sum_g1, h);
    CHECK(b == static_cast<float>(N + 1), b);
    CHECK(t == std::vector<float>(3, sum_g1), t[0]);
    CHECK(m == std::vector<double>(2, N + 1.0), m[0]);
    CHECK(i == (std::vector<int32_t>{N * (N - 1) / 2, N}), i[0]);
    CHECK(one == static_cast<float>(N), one);
    CHECK(gs == N * (N - 1) / 2, gs);
  }

  // Asynchronous collectives and gradient buckets span the workers too (waited out of issue order,
  // the buckets' all-reduces in between).
  auto async = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    auto a = ctx->all_reduce_async(ReduceOp::SUM, Tensor<float>::full({4}, static_cast<float>(g + 1)));
    auto m = ctx->all_reduce_async(ReduceOp::MEAN, Tensor<double>::full({3}, 2.0 * (g + 1)));
    GradientBuckets<float> buckets(ReduceOp::SUM, 8);
    for (int k = 1; k <= 3; ++k) buckets.push(Tensor<float>::full({k}, static_cast<float>(k * (g + 1))));
    std::vector<std::vector<float>> grads;
    for (const auto& t : buckets.finish()) grads.push_back(t.to_vector());
    return std::make_tuple(m.wait().to_vector(), a.wait().to_vector(), grads);
  });
  for (int r = 0; r < R; ++r) {
    const auto& [m, a, grads] = async[r];
    CHECK(m == std::vector<double>(3, N + 1.0), m[0]);
    CHECK(a == std::vector<float>(4, sum_g1), a[0]);
    CHECK(grads.size() == 3, grads.size());
    for (std::size_t k = 1; k <= grads.size(); ++k)
      CHECK(grads[k - 1] == std::vector<float>(k, static_cast<float>(k) * sum_g1), grads[k - 1][0]);
  }

  // A large all-reduce (several chunks of a shared-memory slot; many Gloo segments).
  constexpr int64_t kBig = 300001;
  auto big = s.run([&] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    std::vector<float> v(kBig);
    for (int64_t k = 0; k < kBig; ++k) v[k] = static_cast<float>(g + k % 7);
    auto out = get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::from_vector(v, {kBig}));
    const auto host = out.to_vector();
    int64_t bad = -1;
    for (int64_t k = 0; k < kBig && bad < 0; ++k)
      if (host[k] != static_cast<float>(N * (N - 1) / 2 + N * (k % 7))) bad = k;
    return bad;
  });
  for (int r = 0; r < R; ++r) CHECK(big[r] == -1, "first wrong element ", big[r]);

  // all_gather: replica g contributes g + 1 rows of [g, g]; and along axis 1.
  auto gathered = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    auto rows = ctx->all_gather(Tensor<float>::full({g + 1, 2}, static_cast<float>(g)), 0);
    auto cols = ctx->all_gather(Tensor<int64_t>::full({2, g + 1}, g), 1);
    return std::make_tuple(rows.shape(), rows.to_vector(), cols.shape(), cols.to_vector());
  });
  std::vector<float> want_rows;
  std::vector<int64_t> want_cols;
  for (int g = 0; g < N; ++g) want_rows.insert(want_rows.end(), 2 * (g + 1), static_cast<float>(g));
  for (int row = 0; row < 2; ++row)
    for (int g = 0; g < N; ++g) want_cols.insert(want_cols.end(), g + 1, g);
  for (int r = 0; r < R; ++r) {
    const auto& [rs, rv, cs, cv] = gathered[r];
    CHECK(rs == (Shape{N * (N + 1) / 2, 2}), detail::format_shape(rs));
    CHECK(rv == want_rows, "");
    CHECK(cs == (Shape{2, N * (N + 1) / 2}), detail::format_shape(cs));
    CHECK(cv == want_cols, "");
  }

  // merge_call: merge_fn runs once per worker on its replicas' values; reduce inside spans workers.
  int merges = 0;
  auto merged = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const float mine = static_cast<float>(ctx->replica_id_in_sync_group() + 1);
    return ctx->merge_call(
        [&](Strategy& st, const PerReplica<Tensor<float>>& v) {
          ++merges;
          CHECK(static_cast<int>(v.size()) == R, v.size());
          return st.reduce(ReduceOp::SUM, v, std::nullopt).item();
        },
        Tensor<float>::scalar(mine));
  });
  CHECK(merges == 1, merges);
  for (int r = 0; r < R; ++r) CHECK(merged[r] == sum_g1, merged[r]);

  // reduce and gather (cross-replica), along an axis with uneven parts.
  auto parts = s.run([] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    return Tensor<float>::full({g + 1}, static_cast<float>(g));
  });
  const float sum_axis = s.reduce(ReduceOp::SUM, parts, 0).item();
  float want = 0;
  for (int g = 0; g < N; ++g) want += static_cast<float>(g * (g + 1));
  CHECK(sum_axis == want, sum_axis, " vs ", want);
  auto ones = s.run([] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    return Tensor<float>::full({g + 1}, 3.0f);
  });
  CHECK(s.reduce(ReduceOp::MEAN, ones, 0).item() == 3.0f, "");
  CHECK(s.reduce(ReduceOp::MEAN, s.run([] { return 2.0; }), std::nullopt) == 2.0, "");
  const auto all = s.gather(parts, 0);
  std::vector<float> want_all;
  for (int g = 0; g < N; ++g) want_all.insert(want_all.end(), g + 1, static_cast<float>(g));
  CHECK(all.to_vector() == want_all, "");

  // Variables take the chief's initial value; optimizers all-reduce across workers.
  std::optional<Variable<float>> w;
  std::optional<Variable<float>> metric;
  {
    auto scope = s.scope();
    w.emplace(Tensor<float>::full({2}, static_cast<float>(100 * rank + 5)));
    VariableOptions o;
    o.synchronization = VariableSynchronization::ON_READ;
    o.aggregation = VariableAggregation::SUM;
    metric.emplace(0.0f, o);
  }
  for (const auto& c : w->components()) CHECK(c.to_vector() == std::vector<float>(2, 5.0f), c.to_vector()[0]);
  optimizers::SGD<float> sgd(optimizers::SGDOptions{.learning_rate = 1.0});
  s.run([&] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    sgd.apply_gradients({{Tensor<float>::full({2}, static_cast<float>(g + 1)), *w}});
    metric->assign(static_cast<float>(g + 1));
  });
  for (const auto& c : w->components()) CHECK(c.to_vector() == std::vector<float>(2, 5.0f - sum_g1), c.to_vector()[0]);
  CHECK(metric->value().item() == sum_g1, metric->value().item());
  auto created = s.run([] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    Variable<float> v(static_cast<float>(g + 7));  // created once per worker, from the chief's replica 0
    return v.value().item();
  });
  for (int r = 0; r < R; ++r) CHECK(created[r] == 7.0f, created[r]);

  // batch_reduce_to across workers.
  auto vals = s.run([] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    return Tensor<float>::full({2}, static_cast<float>(g + 1));
  });
  auto packed = s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{vals, *w}, {vals, *w}});
  for (const auto& m : packed)
    for (const auto& c : m.values()) CHECK(c.to_vector() == std::vector<float>(2, sum_g1), c.to_vector()[0]);
  auto mean = s.extended().batch_reduce_to<float>(ReduceOp::MEAN, {{vals, *w}});
  for (const auto& c : mean[0].values())
    CHECK(c.to_vector() == std::vector<float>(2, sum_g1 / static_cast<float>(N)), c.to_vector()[0]);

  // reduce_scatter spans the workers: global replica g gets its BALANCED rows of the sum of every
  // replica of every worker (synchronous and asynchronous alike).
  const int64_t rows = 2 * N + 1;
  auto scattered = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    std::vector<float> v;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 2; ++j) v.push_back(static_cast<float>(10 * i + j + g));
    const auto x = Tensor<float>::from_vector(v, {rows, 2});
    auto pending = ctx->reduce_scatter_async(ReduceOp::MEAN, x);
    const auto sum = ctx->reduce_scatter(ReduceOp::SUM, x);
    return std::make_tuple(sum.shape(), sum.to_vector(), pending.wait().to_vector());
  });
  for (int r = 0; r < R; ++r) {
    const auto piece = detail::balanced_piece(rows, N, rank * R + r);
    const auto& [shape, sum, mean] = scattered[r];
    CHECK(shape == (Shape{piece.count, 2}), detail::format_shape(shape));
    for (int64_t i = 0; i < piece.count; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const float want = static_cast<float>(N * (10 * (piece.begin + i) + j) + N * (N - 1) / 2);
        CHECK(sum[static_cast<std::size_t>(2 * i + j)] == want, sum[static_cast<std::size_t>(2 * i + j)]);
        CHECK(mean[static_cast<std::size_t>(2 * i + j)] == want / static_cast<float>(N), "mean");
      }
    }
  }

  // Sharded optimizer state spans the workers: each replica of each worker keeps its slice of the
  // slots, and the weights and slots keep the bits of the unsharded optimizer. The gradients are
  // integer-valued: across three workers or more the ring adds the workers' sums in an order that
  // depends on where an element lies in the message, which differs between the two layouts.
  std::vector<Variable<float>> plain_vars, sharded_vars;
  {
    auto scope = s.scope();
    for (const Shape& shape : {Shape{5}, Shape{3, 3}}) {
      plain_vars.emplace_back(Tensor<float>::full(shape, 0.5f));
      sharded_vars.emplace_back(Tensor<float>::full(shape, 0.5f));
    }
  }
  optimizers::Adam<float> plain_adam({.learning_rate = 0.1});
  optimizers::Adam<float> sharded_adam({.learning_rate = 0.1, .shard_optimizer_state = true});
  for (int step = 0; step < 3; ++step) {
    s.run([&] {
      const int g = get_replica_context()->replica_id_in_sync_group();
      for (auto* set : {&plain_vars, &sharded_vars}) {
        optimizers::GradsAndVars<float> gv;
        for (const auto& v : *set)
          gv.emplace_back(Tensor<float>::full(v.shape(), static_cast<float>((g + 1) * (step + 1))), v);
        (set == &plain_vars ? static_cast<optimizers::Optimizer<float>&>(plain_adam) : sharded_adam)
            .apply_gradients(gv);
      }
    });
  }
  for (std::size_t k = 0; k < plain_vars.size(); ++k) {
    for (int r = 0; r < R; ++r)
      CHECK(plain_vars[k].components()[r].to_vector() == sharded_vars[k].components()[r].to_vector(), "weights ", k);
    for (const char* slot : {"m", "v"}) {
      const Variable<float> sharded_slot = sharded_adam.get_slot(sharded_vars[k], slot);
      CHECK(sharded_slot.is_sharded(), slot);
      CHECK(sharded_slot.value().to_vector() == plain_adam.get_slot(plain_vars[k], slot).value().to_vector(), slot);
    }
  }
  CHECK(sharded_adam.state_bytes_per_replica()[0] < plain_adam.state_bytes_per_replica()[0], "state bytes");

  // The input pipeline: DATA sharding gives each worker its replicas' slices of every batch.
  const auto ds = data::Dataset<>::range(4 * N).batch(2 * N);
  int64_t local_sum = 0, local_count = 0;
  for (const auto& batch : s.experimental_distribute_dataset(ds)) {
    for (const auto& part : batch.values()) {
      for (int64_t x : part.to_vector()) {
        local_sum += x;
        ++local_count;
      }
    }
  }
  CHECK(local_count == 4 * R, local_count);
  auto totals = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    return ctx->all_reduce(ReduceOp::SUM, ctx->replica_id_in_sync_group() % R == 0 ? local_sum : int64_t{0});
  });
  CHECK(totals[0] == int64_t{4 * N} * (4 * N - 1) / 2, totals[0]);

  // A mismatch across workers is an error on every worker, and the strategy stays usable.
  std::string error;
  try {
    s.run([&] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::zeros({rank == 1 ? 3 : 2})); });
  } catch (const InvalidArgumentError& e) {
    error = e.what();
  }
  CHECK(error.find("worker 1") != std::string::npos && error.find("float32(2,)") != std::string::npos &&
            error.find("float32(3,)") != std::string::npos,
        "error was: ", error);
  auto after = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
  CHECK(after[0] == static_cast<float>(N), after[0]);
  // Likewise all_gather parts that differ off the axis on one worker.
  error.clear();
  try {
    s.run([&] { return get_replica_context()->all_gather(Tensor<float>::zeros({1, rank == 1 ? 3 : 2}), 0); });
  } catch (const InvalidArgumentError& e) {
    error = e.what();
  }
  CHECK(error.find("shapes may differ only along axis 0") != std::string::npos, "error was: ", error);
  CHECK(s.gather(s.run([] { return Tensor<float>{1}; }), 0).numel() == N, "");
}

int collectives(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  check_collectives(s);
  if (g_failures == 0) std::cout << "OK worker " << s.extended().worker_index() << std::endl;
  return g_failures ? 1 : 0;
}

// The ring all-reduce between workers at the sizes where its blocks and segments go uneven:
// fewer elements than workers, sizes around a multiple of the worker count, and buffers of
// several segments per block (a block of 1.5M floats on 2 workers is 3 MB: 3 segments). Every
// element checked, for each dtype the ring carries.
template <class T>
void check_ring_sizes(MultiWorkerMirroredStrategy& s, const std::vector<int64_t>& sizes) {
  const int W = s.extended().num_workers();
  const int R = static_cast<int>(s.extended().worker_devices().size());
  for (const int64_t n : sizes) {
    auto out = s.run([n] {
      const int g = get_replica_context()->replica_id_in_sync_group();
      std::vector<T> v(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(i % 7 + g);
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<T>::from_vector(std::move(v), {n}));
    });
    const int N = W * R;
    for (int r = 0; r < R; ++r) {
      const std::vector<T> got = out[r].to_vector();
      int64_t bad = -1;
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        const T want = static_cast<T>(N * (i % 7) + N * (N - 1) / 2);
        if (got[static_cast<std::size_t>(i)] != want) bad = i;
      }
      CHECK(bad < 0, dtype_name(dtype_of<T>()), " n=", n, " replica ", r, " element ", bad);
    }
  }
}

int ring(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const std::vector<int64_t> small{1, 2, 3, 5, 63, 64, 65, 1001};
  check_ring_sizes<float>(s, small);
  check_ring_sizes<float>(s, {1'500'001});
  check_ring_sizes<double>(s, {7, 700'003});
  check_ring_sizes<int32_t>(s, small);
  check_ring_sizes<int64_t>(s, {3, 1001});
  check_ring_sizes<uint8_t>(s, {1, 4097});
  if (g_failures == 0) std::cout << "OK worker " << s.extended().worker_index() << std::endl;
  return g_failures ? 1 : 0;
}

// Worker 1 calls a different collective: every worker gets FailedPreconditionError.
int mismatch(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  std::string error;
  try {
    if (rank == 1) {
      s.gather(s.run([] { return Tensor<float>{1}; }), 0);
    } else {
      s.reduce(ReduceOp::SUM, s.run([] { return Tensor<float>{1}; }), std::nullopt);
    }
  } catch (const FailedPreconditionError& e) {
    error = e.what();
  }
  CHECK(error.find("different number of collective calls") != std::string::npos, "error was: ", error);
  const float x = s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);
  CHECK(x == static_cast<float>(s.num_replicas_in_sync()), x);
  if (g_failures == 0) std::cout << "OK" << std::endl;
  return g_failures ? 1 : 0;
}

// Runs all-reduces; the victim kills (SIGKILL) or stops (SIGSTOP) itself before step `a.step`;
// the others check the error they get, how long it took, and that the next collective fails.
// --step all-reduces of --elements integer-valued floats, exact sums checked, each one's time
// printed ("all_reduce 0 took 5.2 s").
int big(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), nullptr, cpus(a.replicas));
  const int64_t n = a.elements;
  const int N = s.num_replicas_in_sync();
  for (int step = 0; step < a.step; ++step) {
    const auto start = Clock::now();
    auto out = s.run([&] {
      const int g = get_replica_context()->replica_id_in_sync_group();
      std::vector<float> v(static_cast<std::size_t>(n));
      for (int64_t k = 0; k < n; ++k) v[static_cast<std::size_t>(k)] = static_cast<float>(g + k % 5);
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::from_vector(v, {n})).to_vector();
    });
    std::cout << "all_reduce " << step << " took " << std::chrono::duration<double>(Clock::now() - start).count()
              << " s" << std::endl;
    for (int r = 0; r < static_cast<int>(out.size()); ++r) {
      const auto& v = out[r];
      int64_t bad = -1;
      for (int64_t k = 0; k < n && bad < 0; ++k)
        if (v[static_cast<std::size_t>(k)] != static_cast<float>(N * (N - 1) / 2 + N * (k % 5))) bad = k;
      CHECK(bad < 0, "replica ", r, " element ", bad);
    }
  }
  return g_failures ? 1 : 0;
}

int fault(const Args& a, bool kill) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  for (int step = 0;; ++step) {
    if (rank == a.victim && step == a.step) {
      std::cout << "victim " << rank << " " << (kill ? "dies" : "stops") << std::endl;
      raise(kill ? SIGKILL : SIGSTOP);
      return 0;  // a stopped victim is killed by the harness
    }
    const auto start = Clock::now();
    try {
      auto out =
          s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({64}, 1.0f)); });
      CHECK(out[0].to_vector()[0] == static_cast<float>(s.num_replicas_in_sync()), "");
      if (step > a.step) {
        std::cout << "no error after the victim's " << (kill ? "death" : "stop") << std::endl;
        return 3;
      }
    } catch (const UnavailableError& e) {
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      std::cout << "UnavailableError after " << took << " s: " << e.what() << std::endl;
      CHECK(kill, "a stopped peer must give DeadlineExceededError");
      CHECK(std::string(e.what()).find(detail::str_cat("worker ", a.victim)) != std::string::npos, "");
      CHECK(took < 2.0, took);
      break;
    } catch (const DeadlineExceededError& e) {
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      std::cout << "DeadlineExceededError after " << took << " s: " << e.what() << std::endl;
      CHECK(!kill, "a dead peer must give UnavailableError");
      // The flight recorder's report names the stopped worker, which could not post its state.
      CHECK(std::string(e.what()).find(detail::str_cat("worker ", a.victim, " (")) != std::string::npos &&
                std::string(e.what()).find("reported no state within") != std::string::npos,
            "no flight-recorder report naming the stopped worker");
      CHECK(took >= a.timeout * 0.9 && took < a.timeout + 15, took);
      break;
    }
  }
  // Afterwards every collective fails at once.
  std::string error;
  try {
    s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
  } catch (const FailedPreconditionError& e) {
    error = e.what();
  }
  CHECK(error.find("failed earlier") != std::string::npos, "error was: ", error);
  try {
    s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);
    CHECK(false, "reduce after a failure succeeded");
  } catch (const FailedPreconditionError&) {
  }
  std::cout << (g_failures == 0 ? "OK" : "FAILED") << std::endl;
  return g_failures ? 1 : 0;
}

// One deadline across workers: worker `victim` never enters the all-reduce, and on the other
// workers the leader replica (local replica 0, which drives the cross-worker stage) enters it
// 0.9 × timeout after replica 1. The error must come by the deadline replica 1's call set, plus
// the grace: neither the late leader nor the cross-worker stage may start a timeout of its own.
int late_leader(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(2));
  const int rank = s.extended().worker_index();
  if (rank == a.victim) {
    std::cout << "victim " << rank << " never calls" << std::endl;
    for (;;) pause();  // killed by the harness
  }
  const auto start = Clock::now();
  try {
    s.run([&] {
      if (get_replica_context()->replica_id_in_sync_group() % 2 == 0)  // local replica 0 of 2
        std::this_thread::sleep_for(std::chrono::duration<double>(0.9 * a.timeout));
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({64}, 1.0f));
    });
    CHECK(false, "the all_reduce succeeded without worker ", a.victim);
  } catch (const DeadlineExceededError& e) {
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    std::cout << "DeadlineExceededError after " << took << " s: " << e.what() << std::endl;
    CHECK(took >= a.timeout && took < a.timeout + kCollectiveGraceSeconds, "took ", took, " s for a timeout of ",
          a.timeout, " s (grace ", kCollectiveGraceSeconds, " s)");
  }
  std::cout << (g_failures == 0 ? "OK" : "FAILED") << std::endl;
  return g_failures ? 1 : 0;
}

// The victim skips the all-reduce of step `step` and then computes "forever" (killed by the
// harness): the others' all-reduce fails at the timeout plus the grace, with a flight-recorder
// report naming the victim as behind.
int skip(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  auto step_once = [&] {
    s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({64}, 1.0f)); });
  };
  for (int step = 0; step < a.step; ++step) step_once();
  if (rank == a.victim) {
    std::cout << "victim " << rank << " skips all_reduce #" << a.step + 1 << std::endl;
    for (;;) pause();  // killed by the harness
  }
  const auto start = Clock::now();
  try {
    step_once();
    CHECK(false, "the all_reduce succeeded without worker ", a.victim);
  } catch (const DeadlineExceededError& e) {
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    std::cout << "DeadlineExceededError after " << took << " s: " << e.what() << std::endl;
    CHECK(took < a.timeout + kCollectiveGraceSeconds, "took ", took, " s for a timeout of ", a.timeout, " s");
    const std::string culprit = detail::str_cat("worker ", a.victim, " replica 0 (CPU:0) last completed all_reduce #",
                                                a.step, " and has not entered #", a.step + 1, " for ");
    CHECK(std::string(e.what()).find(culprit) != std::string::npos, "no '", culprit, "' in the message");
    CHECK(std::string(e.what()).find(detail::str_cat("every other replica waits in all_reduce #", a.step + 1)) !=
              std::string::npos,
          "the others are not reported waiting");
  }
  std::cout << (g_failures == 0 ? "OK" : "FAILED") << std::endl;
  return g_failures ? 1 : 0;
}

// The victim calls all_gather where the others call all_reduce (after `step` good steps): every
// worker fails with FailedPreconditionError whose report names the victim's different call.
int wrong_call(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  for (int step = 0; step < a.step; ++step)
    s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({8}, 1.0f)); });
  const auto start = Clock::now();
  try {
    s.run([&] {
      if (rank == a.victim) return get_replica_context()->all_gather(Tensor<float>::full({8}, 1.0f), 0);
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({8}, 1.0f));
    });
    CHECK(false, "different calls succeeded");
  } catch (const FailedPreconditionError& e) {
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    std::cout << "FailedPreconditionError after " << took << " s: " << e.what() << std::endl;
    CHECK(took < a.timeout + kCollectiveGraceSeconds, "took ", took, " s for a timeout of ", a.timeout, " s");
    const std::string culprit =
        detail::str_cat("worker ", a.victim, " replica 0 (CPU:0) waits in all_gather #", a.step + 1);
    CHECK(std::string(e.what()).find(culprit) != std::string::npos, "no '", culprit, "' in the message");
    CHECK(std::string(e.what()).find(detail::str_cat("every other replica waits in all_reduce #", a.step + 1)) !=
              std::string::npos,
          "the others are not reported waiting");
  }
  std::cout << (g_failures == 0 ? "OK" : "FAILED") << std::endl;
  return g_failures ? 1 : 0;
}

// The victim's replica function throws at step `step`: the others' collective fails at once with
// AbortedError naming it, instead of waiting for the timeout; afterwards collectives fail.
int replica_throws(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  for (int step = 0;; ++step) {
    if (rank == a.victim && step == a.step) {
      try {
        s.run([] { throw std::runtime_error("boom in the replica function"); });
      } catch (const std::runtime_error& e) {
        std::cout << "victim threw: " << e.what() << std::endl;
      }
      break;
    }
    const auto start = Clock::now();
    try {
      s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
      if (step > a.step) {
        std::cout << "no error after the victim's failure" << std::endl;
        return 3;
      }
    } catch (const AbortedError& e) {
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      std::cout << "AbortedError after " << took << " s: " << e.what() << std::endl;
      CHECK(std::string(e.what()).find(detail::str_cat("worker ", a.victim, " (")) != std::string::npos, "");
      CHECK(std::string(e.what()).find("boom in the replica function") != std::string::npos, "");
      CHECK(took < 2.0, took);
      break;
    }
  }
  try {
    s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f); });
    CHECK(false, "a collective after the failure succeeded");
  } catch (const FailedPreconditionError&) {
  }
  if (g_failures == 0) std::cout << "OK" << std::endl;
  return g_failures ? 1 : 0;
}

// Started with fewer workers than the cluster has: start-up fails naming the missing one.
int never_join(const Args& a) {
  try {
    MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  } catch (const DeadlineExceededError& e) {
    std::cout << "DeadlineExceededError: " << e.what() << std::endl;
    CHECK(std::string(e.what()).find(detail::str_cat("worker ", a.victim)) != std::string::npos, "");
    if (g_failures == 0) std::cout << "OK" << std::endl;
    return g_failures ? 1 : 0;
  }
  std::cout << "the strategy started without every worker" << std::endl;
  return 3;
}

// The victim leaves after `step` collectives; the others' next collective fails naming it.
int leave_early(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();
  for (int step = 0; step < a.step; ++step) s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);
  if (rank == a.victim) return 0;  // the destructor says goodbye
  const auto start = Clock::now();
  try {
    s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);
  } catch (const FailedPreconditionError& e) {
    std::cout << "FailedPreconditionError after " << std::chrono::duration<double>(Clock::now() - start).count()
              << " s: " << e.what() << std::endl;
    CHECK(std::string(e.what()).find(detail::str_cat("worker ", a.victim, " (")) != std::string::npos, "");
    CHECK(std::string(e.what()).find("left the job") != std::string::npos, "");
    if (g_failures == 0) std::cout << "OK" << std::endl;
    return g_failures ? 1 : 0;
  }
  std::cout << "no error after the victim left" << std::endl;
  return 3;
}

// The strategy's default devices (no local_devices: this worker's share of its machine's GPUs),
// printed as "worker K devices GPU:0,GPU:1", and an all-reduce over every worker's replicas on them.
int default_devices(const Args& a) {
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment());
  std::string names;
  for (const auto& d : s.extended().worker_devices()) names += (names.empty() ? "" : ",") + d.short_name();
  std::cout << "worker " << s.extended().worker_index() << " devices " << names << std::endl;
  const int N = s.num_replicas_in_sync();
  const auto sums = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    const auto g = static_cast<float>(ctx->replica_id_in_sync_group());
    return ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({3}, g + 1)).to_vector();
  });
  for (const auto& v : s.experimental_local_results(sums))
    CHECK(v == std::vector<float>(3, static_cast<float>(N * (N + 1) / 2)), v[0]);
  if (g_failures == 0) std::cout << "OK worker " << s.extended().worker_index() << std::endl;
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (a.scenario == "collectives") return collectives(a);
    if (a.scenario == "mismatch") return mismatch(a);
    if (a.scenario == "ring") return ring(a);
    if (a.scenario == "compression") return compression(a);
    if (a.scenario == "checkpoint") return checkpoint_scenario(a);
    if (a.scenario == "uneven") return uneven_scenario(a);
    if (a.scenario == "uneven_failure") return uneven_failure_scenario(a);
    if (a.scenario == "uneven_mismatch") return uneven_mismatch_scenario(a);
    if (a.scenario == "big") return big(a);
    if (a.scenario == "agreement_loop") return agreement_loop_scenario(a);
    if (a.scenario == "kill") return fault(a, true);
    if (a.scenario == "stop") return fault(a, false);
    if (a.scenario == "never_join") return never_join(a);
    if (a.scenario == "leave_early") return leave_early(a);
    if (a.scenario == "replica_throws") return replica_throws(a);
    if (a.scenario == "late_leader") return late_leader(a);
    if (a.scenario == "skip") return skip(a);
    if (a.scenario == "wrong_call") return wrong_call(a);
    if (a.scenario == "default_devices") return default_devices(a);
    if (a.scenario == "hello") {
      MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
      std::cout << "hello from worker " << s.extended().worker_index() << " of " << s.extended().num_workers()
                << std::endl;
      return 0;
    }
    std::cerr << "unknown scenario " << a.scenario << "\n";
    return 2;
  } catch (const Error& e) {
    std::cout << "unexpected " << error_code_name(e.code()) << ": " << e.what() << std::endl;
    return 1;
  }
}
