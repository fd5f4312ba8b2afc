#pragma once
// Helpers of the CheckpointManager tests: a scratch directory, a small model trained by an
// optimizer on CPU replicas, its whole state as bytes, and a fake iterator state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <mirrored/checkpoint_manager.hpp>

#include "fs_test_util.hpp"
#include "gtest_util.hpp"
#include "harness.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored::manager_testing {

namespace fs = std::filesystem;
using mirrored::testing::cpus;
using mirrored::testing::error_of;

// The optimizer kinds of the optimizer tests (SGD with momentum 0.9, Adam, RMSprop, Adagrad, ...).
using Opt = mirrored::testing::Kind;

inline std::string opt_name(Opt o) { return mirrored::testing::kind_name(o); }
inline std::vector<std::string> opt_slots(Opt o) { return mirrored::testing::slot_names(o); }

inline std::unique_ptr<optimizers::Optimizer<float>> make_optimizer(Opt o, bool sharded) {
  return mirrored::testing::make_optimizer<float>(o, sharded);
}

// Sizes that no replica count divides (sharded slices of unequal length).
inline const std::vector<Shape> kShapes{{7, 3}, {5}, {1}, {2, 2, 3}};
inline const std::vector<std::string> kNames{"dense/kernel", "dense/bias", "scale", "conv/kernel"};

/// Replica r's gradient of variable k at `step` (arbitrary values, the same in every run).
inline Tensor<float> gradient(const Shape& shape, int k, int r, int step) {
  std::vector<float> v(static_cast<std::size_t>(detail::shape_numel(shape, sizeof(float))));
  uint32_t seed = 2654435761u * static_cast<uint32_t>(step + 1) + 40503u * static_cast<uint32_t>(k) +
                  97u * static_cast<uint32_t>(r);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<double>(seed >> 8) / 16777216.0 * 2.0 - 0.9);
  }
  return Tensor<float>::from_vector(v, shape);
}

/// Variables (made in the strategy's scope from `init_seed`) and their optimizer.
struct Model {
  Model(int replicas, Opt o, bool sharded, int init_seed = 0) : strategy(cpus(replicas)), kind(o) {
    auto scope = strategy.scope();
    for (std::size_t k = 0; k < kShapes.size(); ++k) {
      VariableOptions vo;
      vo.name = kNames[k];
      vars.emplace_back(gradient(kShapes[k], static_cast<int>(k), 99, init_seed) * 3.0f, vo);
    }
    opt = make_optimizer(o, sharded);
  }
  /// Steps `first` .. `first + count - 1` of training.
  void train(int first, int count) {
    for (int step = first; step < first + count; ++step) {
      strategy.run([&] {
        const int r = get_replica_context()->replica_id_in_sync_group();
        optimizers::GradsAndVars<float> gv;
        for (std::size_t k = 0; k < vars.size(); ++k)
          gv.emplace_back(gradient(kShapes[k], static_cast<int>(k), r, step), vars[k]);
        opt->apply_gradients(gv);
      });
    }
  }
  void track(checkpoint::CheckpointManager& m) {
    for (std::size_t k = 0; k < vars.size(); ++k) m.track(kNames[k], vars[k]);
    m.track("optimizer", *opt);
  }

  MirroredStrategy strategy;
  Opt kind;
  std::vector<Variable<float>> vars;
  std::unique_ptr<optimizers::Optimizer<float>> opt;
};

/// Everything a model ends with, as bits: every copy of every weight, every copy (or slice) of
/// every slot, every copy of the step counter.
struct State {
  std::vector<std::vector<uint32_t>> weights, slots;
  std::vector<int64_t> iterations;
  bool operator==(const State&) const = default;
};

inline std::vector<uint32_t> bits(const Tensor<float>& t) {
  const std::vector<float> v = t.to_vector();
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

inline std::vector<uint32_t> all_copies(const Variable<float>& v) {
  std::vector<uint32_t> out;
  for (const auto& c : v.components()) {
    const auto b = bits(c);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

/// `m`'s state; `whole_slots`: each slot's whole value (comparable across replica counts and
/// sharding) instead of its copies.
inline State state_of(const Model& m, bool whole_slots = false) {
  State s;
  for (const auto& v : m.vars) {
    s.weights.push_back(whole_slots ? bits(v.value()) : all_copies(v));
    for (const auto& name : opt_slots(m.kind)) {
      const Variable<float> slot = m.opt->get_slot(v, name);
      s.slots.push_back(whole_slots ? bits(slot.value()) : all_copies(slot));
    }
  }
  if (const auto it = detail::OptimizerAccess::iterations(*m.opt)) {
    for (const auto& c : it->components()) s.iterations.push_back(c.item());
    if (whole_slots) s.iterations.resize(1);
  }
  return s;
}

/// A stand-in for a distributed iterator: its position and the replica count it was made for,
/// as opaque bytes; `restore_state` refuses another replica count (as the real one does).
struct FakeIterator {
  int64_t position = 0;
  int64_t replicas = 1;
  std::string save_state() const {
    std::string s(16, '\0');
    std::memcpy(s.data(), &position, 8);
    std::memcpy(s.data() + 8, &replicas, 8);
    return s;
  }
  void restore_state(const std::string& s) {
    if (s.size() != 16) throw InvalidArgumentError("FakeIterator: state of " + std::to_string(s.size()) + " bytes");
    int64_t saved_replicas = 0, saved_position = 0;
    std::memcpy(&saved_position, s.data(), 8);
    std::memcpy(&saved_replicas, s.data() + 8, 8);
    if (saved_replicas != replicas)
      throw InvalidArgumentError("FakeIterator: saved with " + std::to_string(saved_replicas) +
                                 " replicas, this iterator has " + std::to_string(replicas));
    position = saved_position;
  }
};

inline void track_fake(checkpoint::CheckpointManager& m, const std::string& name, FakeIterator& it) {
  detail::CheckpointManagerAccess::track_state(
      m, name, [&it] { return it.save_state(); }, [&it](const std::string& s) { it.restore_state(s); });
}

using testing::read_file;  // fs_test_util.hpp's
using testing::write_file;

/// The names in `dir`, sorted.
inline std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The spares a live manager keeps in `dir` (`.ckpt-spare.<random>`), sorted.
inline std::vector<std::string> spares(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : listing(dir))
    if (name.rfind(".ckpt-spare.", 0) == 0) out.push_back(name);
  return out;
}

/// The names in `dir` but the spares, sorted.
inline std::vector<std::string> listing_but_spares(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& name : listing(dir))
    if (name.rfind(".ckpt-spare.", 0) != 0) out.push_back(name);
  return out;
}

/// A scratch directory per test.
class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mirrored_manager_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/ckpts";
  }
  void TearDown() override {
    detail::set_checkpoint_fault_hook(nullptr);
    set_log_sink({});
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  std::string root_, dir_;
};

}  // namespace mirrored::manager_testing
