// The scenario "compression" of mirrored_mw_worker: CommunicationOptions::compression across
// workers. Every result is compared bit for bit with the rule of <mirrored/communication_options.hpp>,
// computed here from the inputs: worker w's contribution is its replicas' sum (in replica order, in
// the tensor's type), rounded to the half type; the contributions are added in float in worker
// order; that sum is rounded to the half type once and widened (MEAN then divides by every
// replica). Integer-valued inputs are also checked against their exact sum, and a case with
// non-integer inputs checks that the rule differs from the full-precision sum (so the comparison
// could fail). Other dtypes must come out exactly as without compression.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "mw_worker.hpp"

namespace mirrored::mw {
namespace {

// Global replica g's input element k.
template <class T>
using Inputs = std::function<T(int g, int64_t k)>;

// Worker w's contribution to element k, rounded to H: its R replicas' sum in replica order, as
// the local reduction adds them.
template <class H, class T>
float contribution(const Inputs<T>& x, int w, int R, int64_t k) {
  T local = x(w * R, k);
  for (int r = 1; r < R; ++r) local = static_cast<T>(local + x(w * R + r, k));
  return static_cast<float>(H(static_cast<float>(local)));
}

// The rule for element k over W workers of R replicas.
template <class H, class T>
T rule(const Inputs<T>& x, int W, int R, int64_t k) {
  float sum = contribution<H>(x, 0, R, k);
  for (int w = 1; w < W; ++w) sum += contribution<H>(x, w, R, k);
  return static_cast<T>(static_cast<float>(H(sum)));
}

template <class T>
T rule_for(Compression c, const Inputs<T>& x, int W, int R, int64_t k) {
  return c == Compression::FP16 ? rule<float16>(x, W, R, k) : rule<bfloat16>(x, W, R, k);
}

// Bitwise equality (NaN == NaN of the same bits, -0 != +0).
template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// --gpus 1: the local replicas (this many) are GPU:0..R-1 and every input lives on its replica's
// GPU, so the compressed packs are rounded and widened by the GPUs' cast kernels.
int g_gpu_replicas = 0;

template <class T>
Tensor<T> input(const Inputs<T>& x, int g, int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[static_cast<std::size_t>(k)] = x(g, k);
  auto t = Tensor<T>::from_vector(std::move(v), {n});
  return g_gpu_replicas > 0 ? t.to(Device(DeviceType::GPU, g % g_gpu_replicas)) : t;
}

// The first element of `got` (starting at element `first` of the whole) that is not `want(k)`; -1 if none.
template <class T>
int64_t first_wrong(const std::vector<T>& got, int64_t first, const std::function<T(int64_t)>& want) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], want(first + static_cast<int64_t>(i)))) return first + static_cast<int64_t>(i);
  return -1;
}

struct Setup {
  int W, R, N;
};

Setup setup(MultiWorkerMirroredStrategy& s) {
  const int W = s.extended().num_workers();
  const int R = static_cast<int>(s.extended().worker_devices().size());
  return {W, R, W * R};
}

CommunicationOptions compressed(Compression c) {
  CommunicationOptions o;
  o.compression = c;
  return o;
}

// all_reduce (and all_reduce_async) of `n` elements against the rule, on every replica.
template <class T>
void check_all_reduce(MultiWorkerMirroredStrategy& s, Compression c, ReduceOp op, int64_t n, const Inputs<T>& x,
                      const char* what) {
  const auto [W, R, N] = setup(s);
  auto want = [&](int64_t k) {
    const T sum = rule_for(c, x, W, R, k);
    return op == ReduceOp::MEAN ? static_cast<T>(sum / static_cast<T>(N)) : sum;
  };
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    const auto sync = ctx->all_reduce(op, input(x, g, n), compressed(c)).to_vector();
    auto pending = ctx->all_reduce_async(op, input(x, g, n), compressed(c));
    return std::make_pair(sync, pending.wait().to_vector());
  });
  for (int r = 0; r < R; ++r) {
    const int64_t bad = first_wrong<T>(out[r].first, 0, want);
    CHECK(bad < 0, what, " ", compression_name(c), " ", reduce_op_name(op), " n=", n, " replica ", r, ": element ", bad,
          " is ", bad < 0 ? 0.0 : static_cast<double>(out[r].first[static_cast<std::size_t>(bad)]), " instead of ",
          bad < 0 ? 0.0 : static_cast<double>(want(bad)));
    CHECK(first_wrong<T>(out[r].second, 0, want) < 0, what, " all_reduce_async ", compression_name(c), " n=", n);
  }
}

// Integer-valued inputs (negative ones too) whose sums stay within both half types' integers: the
// compressed sum is the exact sum.
void check_exact(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  const Inputs<float> x = [](int g, int64_t k) { return static_cast<float>(k % 13 + g - 3); };
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{300001}})
    check_all_reduce<float>(s, c, ReduceOp::SUM, n, x, "integer-valued");
  // Against the exact sum too (not only against the rule computed here).
  auto out = s.run([&] {
    return get_replica_context()->all_reduce(
        ReduceOp::SUM, input(x, get_replica_context()->replica_id_in_sync_group(), 1001), compressed(c));
  });
  const int64_t bad = first_wrong<float>(
      out[0].to_vector(), 0, [N = N](int64_t k) { return static_cast<float>(N * (k % 13 - 3) + N * (N - 1) / 2); });
  CHECK(bad < 0, "integer-valued sum not exact at element ", bad);
  // MEAN divides the exact sum: (1 + … + N) / N.
  const Inputs<float> ids = [](int g, int64_t) { return static_cast<float>(g + 1); };
  auto mean = s.run([&] {
    return get_replica_context()->all_reduce(
        ReduceOp::MEAN, input(ids, get_replica_context()->replica_id_in_sync_group(), 5), compressed(c));
  });
  for (int r = 0; r < R; ++r)
    CHECK(mean[r].to_vector() == std::vector<float>(5, static_cast<float>(N + 1) / 2), mean[r].to_vector()[0]);
}

// Non-integer inputs: the rule, which differs from the full-precision sum.
const Inputs<float> kFractions = [](int g, int64_t k) {
  return 0.1f * static_cast<float>(k % 97) + 0.37f * static_cast<float>(g) + 1.0f / 3.0f - 2.5f;
};

void check_fractions(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  // 300001: many shared-memory chunks (64 KiB slots); 3500001: several Gloo segments per block,
  // more than the pipeline has copies of each area (once: the pipeline does not depend on the type).
  for (const int64_t n : {int64_t{7}, int64_t{300001}, int64_t{c == Compression::FP16 ? 3500001 : 0}})
    check_all_reduce<float>(s, c, ReduceOp::SUM, n, kFractions, "fractions");
  for (const int64_t n : {int64_t{7}, int64_t{300001}})
    check_all_reduce<float>(s, c, ReduceOp::MEAN, n, kFractions, "fractions");
  const Inputs<double> doubles = [](int g, int64_t k) { return 0.01 * static_cast<double>(k) - 0.3 * g + 1e-9; };
  check_all_reduce<double>(s, c, ReduceOp::SUM, 1001, doubles, "float64");
  check_all_reduce<double>(s, c, ReduceOp::MEAN, 1001, doubles, "float64");
  // The rule is not the full-precision sum: the comparisons above can fail.
  int differ = 0;
  for (int64_t k = 0; k < 97; ++k) {
    float full = 0;
    for (int g = 0; g < N; ++g) full += kFractions(g, k);
    differ += !same_bits(full, rule_for(c, kFractions, W, R, k));
  }
  CHECK(differ > 50, "the rule equals the full-precision sum at ", 97 - differ, " of 97 elements");
}

// FP16 contributions or sums of magnitude 65520 and more become infinity (65504 is the largest
// float16; 65519 rounds down to it); BF16 keeps float's range.
void check_range(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  // Element k: every worker contributes each[k], worker 0 also only0[k]; split evenly between
  // a worker's replicas (exactly: halving these is exact).
  const std::vector<float> each{40000.0f, -40000.0f, 30000.0f, 70000.0f, 32752.0f, 1e30f, 0.0f, 0.0f};
  const std::vector<float> only0{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 65519.0f, 65520.0f};
  const auto n = static_cast<int64_t>(each.size());
  const Inputs<float> x = [&, R = R](int g, int64_t k) {
    const auto i = static_cast<std::size_t>(k);
    return (each[i] + (g / R == 0 ? only0[i] : 0.0f)) / static_cast<float>(R);
  };
  check_all_reduce<float>(s, c, ReduceOp::SUM, n, x, "large values");
  auto out = s.run([&] {
    return get_replica_context()->all_reduce(
        ReduceOp::SUM, input(x, get_replica_context()->replica_id_in_sync_group(), n), compressed(c));
  });
  const std::vector<float> got = out[0].to_vector();
  const float inf = std::numeric_limits<float>::infinity();
  const float w = static_cast<float>(W);
  if (c == Compression::FP16) {
    const std::vector<float> want{
        inf, -inf, 30000.0f * w < 65520.0f ? 30000.0f * w : inf, inf, W == 2 ? 65504.0f : inf, inf, 65504.0f, inf};
    CHECK(got == want, "FP16 beyond its range: ", got[0], " ", got[1], " ", got[2], " ", got[3], " ", got[4], " ",
          got[5], " ", got[6], " ", got[7]);
  } else {
    bool finite = true;
    for (float v : got) finite = finite && std::isfinite(v);
    CHECK(finite, "BF16 has float's range");
    CHECK(got[0] == static_cast<float>(bfloat16(w * static_cast<float>(bfloat16(40000.0f)))), got[0]);
  }
}

// reduce_scatter, GradientBuckets and apply_gradients pass the compression through.
void check_paths(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  const int64_t rows = 2 * N + 3;
  auto want = [&](int64_t k) { return rule_for(c, kFractions, W, R, k); };
  auto pieces = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    return ctx->reduce_scatter(ReduceOp::SUM, input(kFractions, g, rows), compressed(c)).to_vector();
  });
  const int rank = s.extended().worker_index();
  for (int r = 0; r < R; ++r) {
    // The BALANCED cut: the first rows % N replicas get one row more.
    const int g = rank * R + r;
    const int64_t floor = rows / N, extra = rows % N;
    const int64_t begin = g * floor + std::min<int64_t>(g, extra);
    CHECK(static_cast<int64_t>(pieces[r].size()) == floor + (g < extra ? 1 : 0), pieces[r].size());
    CHECK(first_wrong<float>(pieces[r], begin, want) < 0, "reduce_scatter ", compression_name(c), " replica ", g);
  }

  const std::vector<int64_t> sizes{3, 40, 5};  // buckets of 64 bytes: {3, 40}, {5}
  auto grads = s.run([&] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    CommunicationOptions o = compressed(c);
    o.bytes_per_pack = 64;
    GradientBuckets<float> buckets(ReduceOp::SUM, o);
    int64_t at = 0;
    for (int64_t size : sizes) {
      std::vector<float> v(static_cast<std::size_t>(size));
      for (int64_t i = 0; i < size; ++i) v[static_cast<std::size_t>(i)] = kFractions(g, at + i);
      buckets.push(Tensor<float>::from_vector(std::move(v), {size}));
      at += size;
    }
    std::vector<float> all;
    for (const auto& t : buckets.finish())
      for (float v : t.to_vector()) all.push_back(v);
    return all;
  });
  for (int r = 0; r < R; ++r) CHECK(first_wrong<float>(grads[r], 0, want) < 0, "GradientBuckets ", compression_name(c));

  // SGD with learning rate 1 from 0: the variable becomes minus the compressed gradient sum.
  std::optional<Variable<float>> w;
  {
    auto scope = s.scope();
    w.emplace(Tensor<float>::zeros({9}));
  }
  optimizers::SGD<float> sgd(optimizers::SGDOptions{.learning_rate = 1.0});
  sgd.communication.compression = c;
  s.run([&] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    sgd.apply_gradients({{input(kFractions, g, 9), *w}});
  });
  for (const auto& component : w->components())
    CHECK(first_wrong<float>(component.to_vector(), 0, [&](int64_t k) { return -want(k); }) < 0, "apply_gradients ",
          compression_name(c));
}

// Integers, and float16 / bfloat16 tensors (already half), cross exactly as without compression.
void check_untouched(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int g = ctx->replica_id_in_sync_group();
    const auto ints = ctx->all_reduce(ReduceOp::SUM, Tensor<int32_t>::full({3}, 100001 + g), compressed(c));
    // 1025 is a float16 but no bfloat16; 2^20 a bfloat16 beyond float16's range.
    const auto halves =
        ctx->all_reduce(ReduceOp::SUM, Tensor<float16>::full({2}, float16(g == 0 ? 1025.0f : 1.0f)), compressed(c));
    const auto bhalves =
        ctx->all_reduce(ReduceOp::SUM, Tensor<bfloat16>::full({2}, bfloat16(1048576.0f)), compressed(c));
    return std::make_tuple(ints.to_vector(), static_cast<float>(halves.to_vector()[1]),
                           static_cast<float>(bhalves.to_vector()[1]));
  });
  for (int r = 0; r < R; ++r) {
    const auto& [ints, half, bhalf] = out[r];
    CHECK(ints == std::vector<int32_t>(3, 100001 * N + N * (N - 1) / 2), ints[0]);
    CHECK(half == static_cast<float>(1024 + N), half);
    CHECK(bhalf == static_cast<float>(N) * 1048576.0f, bhalf);
  }
}

// Workers that pass different compressions: InvalidArgumentError on every worker, naming both
// workers and both compressions, before any data moves; the strategy stays usable.
void check_mismatch(MultiWorkerMirroredStrategy& s) {
  const auto [W, R, N] = setup(s);
  const int rank = s.extended().worker_index();
  const Compression mine = rank == 1 ? Compression::FP16 : Compression::NONE;
  for (const bool scatter : {false, true}) {
    std::string error;
    try {
      s.run([&] {
        ReplicaContext* ctx = get_replica_context();
        const Tensor<float> x = Tensor<float>::full({N}, 1.0f);
        return scatter ? ctx->reduce_scatter(ReduceOp::SUM, x, compressed(mine))
                       : ctx->all_reduce(ReduceOp::SUM, x, compressed(mine));
      });
    } catch (const InvalidArgumentError& e) {
      error = e.what();
    }
    const char* op = scatter ? "reduce_scatter" : "all_reduce";
    CHECK(error.find("worker 0 (") != std::string::npos && error.find("worker 1 (") != std::string::npos &&
              error.find("compression NONE") != std::string::npos &&
              error.find("compression FP16") != std::string::npos && error.find(op) != std::string::npos,
          op, ": error was: ", error);
  }
  auto after =
      s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f, compressed(Compression::FP16)); });
  CHECK(after[0] == static_cast<float>(N), after[0]);
}

// GPU replicas: the casts run on the GPU, so a compressed all-reduce (and a lone replica's
// reduce-scatter) moves half the bytes of an uncompressed one from GPU:0 (the local result's
// device) to the host; several tensors of one pack land at their offsets.
void check_on_gpu(MultiWorkerMirroredStrategy& s, Compression c) {
  const auto [W, R, N] = setup(s);
  const Device gpu0(DeviceType::GPU, 0);
  constexpr int64_t n = 4099;
  // The bytes that left GPU:0 in one all-reduce (or reduce-scatter) compressed `how`.
  auto d2h = [&](bool scatter, Compression how) {
    const uint64_t before = transfer_counts(gpu0).device_to_host_bytes;
    s.run([&] {
      ReplicaContext* ctx = get_replica_context();
      const auto x = input(kFractions, ctx->replica_id_in_sync_group(), n);
      if (scatter)
        (void)ctx->reduce_scatter(ReduceOp::SUM, x, compressed(how));
      else
        (void)ctx->all_reduce(ReduceOp::SUM, x, compressed(how));
    });
    return transfer_counts(gpu0).device_to_host_bytes - before;
  };
  const uint64_t full = d2h(false, Compression::NONE), halves = d2h(false, c);
  CHECK(full - halves == static_cast<uint64_t>(n) * 2, compression_name(c), ": ", full,
        " bytes left GPU:0 uncompressed and ", halves, " compressed; the difference should be the ", n,
        " halves' 2 bytes each");
  if (R == 1) {
    // A lone GPU replica's reduce-scatter sums across workers on its GPU too.
    const uint64_t scatter_full = d2h(true, Compression::NONE), scatter_halves = d2h(true, c);
    CHECK(scatter_full - scatter_halves == static_cast<uint64_t>(n) * 2, "reduce_scatter ", compression_name(c), ": ",
          scatter_full, " bytes left GPU:0 uncompressed and ", scatter_halves, " compressed");
  }
  const std::vector<int64_t> sizes{3, 40, 5};
  auto out = s.run([&] {
    const int g = get_replica_context()->replica_id_in_sync_group();
    std::vector<Tensor<float>> xs;
    int64_t at = 0;
    for (int64_t size : sizes) {
      const Inputs<float> shifted = [at](int g2, int64_t k) { return kFractions(g2, at + k); };
      xs.push_back(input(shifted, g, size));
      at += size;
    }
    std::vector<float> all;
    for (const auto& t : get_replica_context()->all_reduce(ReduceOp::SUM, xs, compressed(c)))
      for (float v : t.to_vector()) all.push_back(v);
    return all;
  });
  for (int r = 0; r < R; ++r)
    CHECK(first_wrong<float>(out[r], 0, [&](int64_t k) { return rule_for(c, kFractions, W, R, k); }) < 0,
          "a pack of three tensors ", compression_name(c), " replica ", r);
}

}  // namespace

int compression(const Args& a) {
  CommunicationOptions o = options(a.timeout);
  if (a.implementation == "ring") o.implementation = CommunicationImplementation::RING;
  std::vector<std::string> devices = cpus(a.replicas);
  if (a.gpus) {
    g_gpu_replicas = a.replicas;
    for (int r = 0; r < a.replicas; ++r) devices[static_cast<std::size_t>(r)] = "GPU:" + std::to_string(r);
  }
  MultiWorkerMirroredStrategy s(o, cluster_resolver_from_environment(), devices);
  for (const Compression c : {Compression::FP16, Compression::BF16}) {
    if (a.gpus) check_on_gpu(s, c);
    check_exact(s, c);
    check_fractions(s, c);
    check_range(s, c);
    check_paths(s, c);
    check_untouched(s, c);
  }
  check_mismatch(s);
  if (g_failures == 0) std::cout << "OK worker " << s.extended().worker_index() << std::endl;
  return g_failures ? 1 : 0;
}

}  // namespace mirrored::mw
