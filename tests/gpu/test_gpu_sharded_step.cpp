// The sharded optimizer step on GPU replicas (one per visible GPU, at most 4): reduce-scatter, the
// fused update of each replica's slice on its GPU, all-gather. Gradients are integer-valued, so
// every sum is exact in any order (NCCL's included) and the sharded step must give the unsharded
// step's bits on the same GPUs, for every optimizer kind, with variables smaller than the number
// of replicas, sizes that do not divide, more variables than one fused launch takes (48), one
// pack per variable and tiny packs. On distinct physical GPUs with NCCL the default ops run the
// step as one stream-ordered sequence (NcclAllReduce::all_reduce_and_update), and the
// device-generic path (ReductionToOneDevice) must give the same bits; on simulated GPUs (CI) the
// generic path runs the host's loops, so the host's CPU replicas give the same bits too. The
// compression casts of the cross-worker path run on the device backend: its casts round like the
// host backend's, bit for bit, at the edges. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "collectives/ops_selection.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "gpu_test_util.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace gpu_sharded_step {  // named: the unity build puts these beside the other gpu tests

using testing::Kind;
using testing::same_bits;
using testing::slot_names;

std::string camel_kind_name(Kind k) {
  std::string name = testing::kind_name(k);
  name[0] = static_cast<char>(name[0] - 'a' + 'A');  // test names as CamelCase
  return name;
}

std::unique_ptr<optimizers::Optimizer<float>> make(Kind k, bool sharded) {
  return testing::make_optimizer<float>(k, sharded, {.learning_rate = 0.5, .momentum = 0.5});
}

// How the variables are packed.
enum class Packing { one_pack, per_variable, tiny_packs, many_variables };

std::string packing_name(Packing p) {
  switch (p) {
    case Packing::one_pack: return "OnePack";
    case Packing::per_variable: return "PerVariable";
    case Packing::tiny_packs: return "TinyPacks";
    case Packing::many_variables: return "FiftyVariables";
  }
  return "?";
}

std::vector<Shape> shapes_of(Packing p) {
  // Sizes that divide by none of 2, 3 and 4, one smaller than every replica count above 1.
  if (p != Packing::many_variables) return {{7, 3}, {5}, {1}, {130}, {2, 2, 3}};
  // More than one fused launch takes (48): two packs, the second of 2 variables.
  std::vector<Shape> out;
  for (int k = 0; k < 50; ++k) out.push_back({k % 7 + 1});
  return out;
}

// Replica r's gradient of variable k at `step`: small integers, so every sum is exact.
Tensor<float> gradient(const Shape& shape, int k, int r, int step, const Device& d) {
  std::vector<float> v(static_cast<std::size_t>(detail::shape_numel(shape, sizeof(float))));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((static_cast<int>(i) * 3 + k * 5 + r * 7 + step * 11) % 9 - 4);
  return Tensor<float>::from_vector(std::move(v), shape, d);
}

// What a run ends with, on the host: every copy of every weight, the whole slots, the step count
// and the optimizer state each replica keeps.
struct Result {
  std::vector<std::vector<float>> weights, slots;
  int64_t iterations = 0;
  std::vector<int64_t> state_bytes;
};

Result train(const std::vector<std::string>& devices, const std::shared_ptr<CrossDeviceOps>& ops, Kind kind,
             bool sharded, Packing packing) {
  MirroredStrategy s(devices, ops);
  const std::vector<Shape> shapes = shapes_of(packing);
  std::vector<Variable<float>> vars;
  {
    auto scope = s.scope();
    for (std::size_t k = 0; k < shapes.size(); ++k)
      vars.emplace_back(gradient(shapes[k], static_cast<int>(k), 5, 0, cpu0) * 0.25f);
  }
  auto opt = make(kind, sharded);
  opt->pack_gradients = packing != Packing::per_variable;
  if (packing == Packing::tiny_packs) opt->communication.bytes_per_pack = 64;
  for (int step = 0; step < 4; ++step) {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      optimizers::GradsAndVars<float> gv;
      for (std::size_t k = 0; k < vars.size(); ++k) {
        const Device d = vars[k].components()[static_cast<std::size_t>(r)].device();
        gv.emplace_back(gradient(shapes[k], static_cast<int>(k), r, step, d), vars[k]);
      }
      opt->apply_gradients(gv);
    });
  }
  Result out;
  for (const auto& v : vars) {
    for (const auto& c : v.components()) out.weights.push_back(c.to_vector());
    for (const auto& name : slot_names(kind)) out.slots.push_back(opt->get_slot(v, name).value().to_vector());
  }
  out.iterations = opt->iterations();
  out.state_bytes = opt->state_bytes_per_replica();
  return out;
}

class GpuShardedStep : public ::testing::TestWithParam<std::tuple<Kind, Packing>> {
 protected:
  void SetUp() override {
    auto gpus = testing::visible_gpus(1, 4);
    if (!gpus.skip.empty()) GTEST_SKIP() << gpus.skip;
    gpus_ = std::move(gpus.gpus);
    cpus_ = std::move(gpus.cpus);
  }
  Kind kind() const { return std::get<0>(GetParam()); }
  Packing packing() const { return std::get<1>(GetParam()); }
  static bool simulated() { return testing::simulated_gpus(); }
  int n() const { return static_cast<int>(gpus_.size()); }
  std::vector<std::string> gpus_, cpus_;
};

TEST_P(GpuShardedStep, WeightsAndSlotsAreBitwiseThoseOfTheUnshardedStep) {
  // The default ops: NCCL's fused step on distinct physical GPUs, the generic one elsewhere.
  const Result unsharded = train(gpus_, nullptr, kind(), false, packing());
  const Result sharded = train(gpus_, nullptr, kind(), true, packing());
  EXPECT_TRUE(same_bits(sharded.weights, unsharded.weights)) << "weights";
  EXPECT_TRUE(same_bits(sharded.slots, unsharded.slots)) << "slots";
  EXPECT_EQ(sharded.iterations, 4);
  EXPECT_EQ(unsharded.iterations, 4);
  // Every copy holds the same weights.
  const std::size_t vars = shapes_of(packing()).size();
  for (std::size_t v = 0; v < vars; ++v)
    for (int r = 1; r < n(); ++r)
      EXPECT_EQ(sharded.weights[v * static_cast<std::size_t>(n()) + static_cast<std::size_t>(r)],
                sharded.weights[v * static_cast<std::size_t>(n())])
          << "variable " << v << ", replica " << r;
  // Each replica keeps its slice of the slots only.
  if (n() > 1 && !slot_names(kind()).empty()) {
    for (int r = 0; r < n(); ++r)
      EXPECT_LT(sharded.state_bytes[static_cast<std::size_t>(r)], unsharded.state_bytes[static_cast<std::size_t>(r)])
          << "replica " << r;
  }
  // The device-generic sharded path on the same GPUs (ReductionToOneDevice: the plan's
  // reduce-scatter and all-gather around the backend's update of the slice).
  const Result generic = train(gpus_, std::make_shared<ReductionToOneDevice>(), kind(), true, packing());
  EXPECT_TRUE(same_bits(generic.weights, unsharded.weights)) << "generic path: weights";
  EXPECT_TRUE(same_bits(generic.slots, unsharded.slots)) << "generic path: slots";
  // The host's loops: simulated GPUs run them, so the CPU replicas' bits are theirs.
  if (simulated()) {
    const Result host = train(cpus_, nullptr, kind(), true, packing());
    EXPECT_TRUE(same_bits(host.weights, sharded.weights)) << "host: weights";
    EXPECT_TRUE(same_bits(host.slots, sharded.slots)) << "host: slots";
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, GpuShardedStep,
                         // Not plain SGD: it has no slots, so its "sharded" step is the unsharded one.
                         ::testing::Combine(::testing::Values(Kind::momentum, Kind::nesterov, Kind::adam, Kind::adamw,
                                                              Kind::rmsprop_centered_momentum, Kind::adagrad),
                                            ::testing::Values(Packing::one_pack, Packing::per_variable,
                                                              Packing::tiny_packs, Packing::many_variables)),
                         [](const auto& info) {
                           return camel_kind_name(std::get<0>(info.param)) + packing_name(std::get<1>(info.param));
                         });

// The explicit NcclAllReduce (real GPUs with NCCL only): the fused sharded step, with its uneven
// pieces (ncclReduce and ncclBroadcast per piece) and even ones (ncclReduceScatter and
// ncclAllGather: every size a multiple of the replicas), equals the unsharded NCCL step bitwise.
TEST(GpuShardedStepNccl, EvenAndUnevenPiecesGiveTheUnshardedBits) {
  const auto gpus = testing::visible_gpus(2, 4);
  if (!gpus.skip.empty()) GTEST_SKIP() << gpus.skip;
  if (!detail::nccl_can_run()) GTEST_SKIP() << "NCCL cannot serve these GPUs (" << detail::gpu_runtime().name() << ")";
  const std::vector<std::string>& devices = gpus.gpus;
  const auto n = static_cast<int64_t>(devices.size());
  for (const int64_t size : {int64_t{12} * n * 1024, int64_t{12} * n * 1024 + 1}) {
    auto run = [&](bool sharded) {
      MirroredStrategy s(devices, std::make_shared<NcclAllReduce>());
      std::optional<Variable<float>> w;
      {
        auto scope = s.scope();
        w.emplace(Tensor<float>::full({size}, 1.0f));
      }
      optimizers::Adam<float> adam({.learning_rate = 0.01, .shard_optimizer_state = sharded});
      for (int step = 0; step < 3; ++step) {
        s.run([&] {
          const int r = get_replica_context()->replica_id_in_sync_group();
          const Device d = w->components()[static_cast<std::size_t>(r)].device();
          adam.apply_gradients({{gradient({size}, 0, r, step, d), *w}});
        });
      }
      std::vector<std::vector<float>> out;
      for (const auto& c : w->components()) out.push_back(c.to_vector());
      out.push_back(adam.get_slot(*w, "v").value().to_vector());
      return out;
    };
    EXPECT_TRUE(same_bits(run(true), run(false))) << size << " elements";
  }
}

// The casts the compressed cross-worker path runs on a GPU (float32 and float64 to float16 and
// bfloat16 and back): bitwise the host backend's, at lengths around a warp and a block and past
// a few blocks, on values that tie, overflow, underflow and carry signs (the grid-stride
// arithmetic past 2^31 is kernel_index.hpp's, tested on the host).
TEST(GpuCompressionCasts, RoundOnTheDeviceAsOnTheHost) {
  const auto gpus = list_logical_devices(DeviceType::GPU);
  if (gpus.empty()) GTEST_SKIP() << "no GPU visible to this process";
  const Device gpu = gpus[0];
  auto& device = detail::backend_for(gpu);
  auto& host = detail::backend_for(cpu0);
  // float16 ties (1 + 2^-11 between 1 and 1 + 2^-10), bfloat16 ties (1 + 2^-8), the largest
  // float16 and the first value that overflows it, subnormals of both, signed zeros, infinity.
  const std::vector<float> edges{1.0f + 0x1p-11f,
                                 1.0f + 3 * 0x1p-11f,
                                 1.0f + 0x1p-8f,
                                 1.0f + 3 * 0x1p-8f,
                                 65504.0f,
                                 65520.0f,
                                 65519.0f,
                                 -65520.0f,
                                 0x1p-24f,
                                 0x1p-25f,
                                 0x1p-126f,
                                 -0.0f,
                                 0.0f,
                                 std::numeric_limits<float>::infinity(),
                                 3.4e38f,
                                 -1.5f,
                                 1e-3f};
  for (const DType wide : {DType::float32, DType::float64}) {
    for (const DType half : {DType::float16, DType::bfloat16}) {
      for (const int64_t n :
           {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{257}, int64_t{65537}}) {
        const std::size_t w = dtype_size(wide), h = dtype_size(half);
        const auto count = static_cast<std::size_t>(n);
        std::vector<unsigned char> in(count * w);
        for (std::size_t i = 0; i < count; ++i) {
          const float f =
              i < edges.size() ? edges[i] : static_cast<float>(static_cast<int64_t>(i % 4099) - 2049) / 7.0f;
          if (wide == DType::float32) {
            std::memcpy(&in[i * w], &f, w);
          } else {
            const double d = static_cast<double>(f) * (1.0 + 0x1p-30);  // bits below float's, rounded away first
            std::memcpy(&in[i * w], &d, w);
          }
        }
        // The host's round trip.
        std::vector<unsigned char> host_half(count * h), host_back(count * w);
        if (n) {
          host.cast(wide, in.data(), half, host_half.data(), n);
          host.cast(half, host_half.data(), wide, host_back.data(), n);
        }
        // The device's.
        auto d_in = detail::make_untyped(wide, {n}, gpu);
        auto d_half = detail::make_untyped(half, {n}, gpu);
        auto d_back = detail::make_untyped(wide, {n}, gpu);
        detail::copy_between(d_in.data(), gpu, in.data(), cpu0, in.size());
        if (n) {
          device.cast(wide, d_in.data(), half, d_half.data(), n);
          device.cast(half, d_half.data(), wide, d_back.data(), n);
        }
        std::vector<unsigned char> got_half(count * h), got_back(count * w);
        detail::copy_between(got_half.data(), cpu0, d_half.data(), gpu, got_half.size());
        detail::copy_between(got_back.data(), cpu0, d_back.data(), gpu, got_back.size());
        const std::string what =
            std::string(dtype_name(wide)) + " -> " + dtype_name(half) + ", n = " + std::to_string(n);
        EXPECT_TRUE(got_half == host_half) << what;
        EXPECT_TRUE(got_back == host_back) << what << " and back";
      }
    }
  }
}

}  // namespace gpu_sharded_step
}  // namespace mirrored
