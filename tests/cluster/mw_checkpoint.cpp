// The scenario "checkpoint" of mirrored_mw_worker: checkpoint::CheckpointManager across workers.
// Every worker trains the same model with sharded Adam (its slots are slices spread over every
// worker's replicas), tracks a per-worker state (a stand-in for its iterator: 100 + its rank) and
// saves together; only the chief writes. Then every worker builds a fresh model and optimizer,
// restores from the shared directory ($MW_CHECKPOINT_DIR) and must hold bitwise the saved
// weights, whole slots and step counter, and its own state back.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <mirrored/checkpoint_manager.hpp>
#include <mirrored/mirrored.hpp>

#include "mw_worker.hpp"

namespace mirrored::mw {
namespace {

const std::vector<Shape> kCkptShapes{{7, 3}, {5}, {1}};

// Global replica g's gradient of variable k at `step`, or (g = -1 - seed) an initial value.
Tensor<float> values(const Shape& shape, int k, int g, int step) {
  std::vector<float> v(static_cast<std::size_t>(detail::shape_numel(shape, sizeof(float))));
  uint32_t seed = 2654435761u * static_cast<uint32_t>(step + 1) + 40503u * static_cast<uint32_t>(k) +
                  97u * static_cast<uint32_t>(g + 7);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<double>(seed >> 8) / 16777216.0 * 2.0 - 0.9);
  }
  return Tensor<float>::from_vector(v, shape);
}

struct CkptModel {
  CkptModel(MultiWorkerMirroredStrategy& s, int init_seed) {
    auto scope = s.scope();
    for (std::size_t k = 0; k < kCkptShapes.size(); ++k)
      vars.emplace_back(values(kCkptShapes[k], static_cast<int>(k), -1 - init_seed, 0),
                        VariableOptions{.name = "v" + std::to_string(k)});
  }
  void train(MultiWorkerMirroredStrategy& s, int first, int count) {
    for (int step = first; step < first + count; ++step) {
      s.run([&] {
        const int g = get_replica_context()->replica_id_in_sync_group();
        optimizers::GradsAndVars<float> gv;
        for (std::size_t k = 0; k < vars.size(); ++k)
          gv.emplace_back(values(kCkptShapes[k], static_cast<int>(k), g, step), vars[k]);
        opt.apply_gradients(gv);
      });
    }
  }
  void track(checkpoint::CheckpointManager& m, std::string& state) {
    for (std::size_t k = 0; k < vars.size(); ++k) m.track("v" + std::to_string(k), vars[k]);
    m.track("adam", opt);
    detail::CheckpointManagerAccess::track_state(
        m, "iterator", [&state] { return state; }, [&state](const std::string& s) { state = s; });
  }
  // Every copy of every weight, the whole slots (a gather across workers) and the step, as bits.
  std::vector<uint32_t> bits() const {
    std::vector<uint32_t> out;
    auto add = [&out](const Tensor<float>& t) {
      const std::vector<float> v = t.to_vector();
      const std::size_t at = out.size();
      out.resize(at + v.size());
      if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
    };
    for (const auto& v : vars) {
      for (const auto& c : v.components()) add(c);
      add(opt.get_slot(v, "m").value());
      add(opt.get_slot(v, "v").value());
    }
    out.push_back(static_cast<uint32_t>(opt.iterations()));
    return out;
  }

  std::vector<Variable<float>> vars;
  optimizers::Adam<float> opt{optimizers::AdamOptions{.learning_rate = 0.01, .shard_optimizer_state = true}};
};

}  // namespace

int checkpoint_scenario(const Args& a) {
  const char* dir_env = std::getenv("MW_CHECKPOINT_DIR");
  CHECK(dir_env && *dir_env, "MW_CHECKPOINT_DIR is not set");
  if (!dir_env) return 1;
  const std::string dir = dir_env;
  MultiWorkerMirroredStrategy s(options(a.timeout), cluster_resolver_from_environment(), cpus(a.replicas));
  const int rank = s.extended().worker_index();

  CkptModel model(s, 0);
  std::string state = "worker state " + std::to_string(100 + rank);
  checkpoint::CheckpointManager manager(s, dir);
  model.track(manager, state);
  model.train(s, 0, 2);
  const std::string path = manager.save(2);
  CHECK(path == dir + "/ckpt-2.safetensors", path);
  const std::vector<uint32_t> saved = model.bits();
  if (rank == 0) {
    // What the chief wrote: both workers' states, the worker count, the whole slots.
    const checkpoint::Checkpoint ckpt = checkpoint::load(path);
    CHECK(ckpt.get<int64_t>("iterator/num_workers").item() == s.extended().num_workers(), "");
    for (int w = 0; w < s.extended().num_workers(); ++w) {
      const Tensor<uint8_t> t = ckpt.get<uint8_t>("iterator/worker_" + std::to_string(w));
      const std::string got(reinterpret_cast<const char*>(t.data()), static_cast<std::size_t>(t.numel()));
      CHECK(got == "worker state " + std::to_string(100 + w), got);
    }
    CHECK(ckpt.get<float>("adam/v0/m").shape() == (Shape{7, 3}), "");
    CHECK(ckpt.get<int64_t>("adam/iterations").item() == 2, "");
  }
  model.train(s, 2, 1);
  state = "moved on";

  // A fresh model and optimizer (no slots) restore on every worker.
  CkptModel fresh(s, 5);
  std::string fresh_state = "fresh";
  checkpoint::CheckpointManager restorer(s, dir);
  fresh.track(restorer, fresh_state);
  const std::optional<int64_t> step = restorer.restore_or_initialize();
  CHECK(step == 2, step.value_or(-1));
  CHECK(fresh.bits() == saved, "the restored state differs from the saved one");
  CHECK(fresh_state == "worker state " + std::to_string(100 + rank), fresh_state);
  // Saving again works after the restore (the chief replaces the step's file).
  CHECK(restorer.save(2) == path, "");
  if (g_failures == 0) std::cout << "OK worker " << rank << std::endl;
  return g_failures ? 1 : 0;
}

}  // namespace mirrored::mw
