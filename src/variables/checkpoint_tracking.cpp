// `CheckpointManager::track` of variables and optimizers: compiled once for every element type
// variables support (optimizers: float and double), so that a user's translation unit only
// declares them.
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/checkpoint_manager.hpp"

namespace mirrored::checkpoint {

template <class T>
void CheckpointManager::track(const std::string& name, Variable<T>& v) {
  const VariableRef ref(v);
  detail::CheckpointTrackable t;
  t.kind = "variable";
  t.save = [name, ref](TensorMap& out) { add_tensor(out, name, ref.read(), "variable '" + name + "'"); };
  t.check = [name, ref](const Checkpoint& ckpt, std::set<std::string>& claimed) {
    ckpt.check(name, ref.dtype(), ref.shape());
    claimed.insert(name);
  };
  t.prepare = [name, ref](const Checkpoint& ckpt) {
    return detail::CheckpointRestoreStep{ref.prepare_write(ckpt.at(name)), {}};
  };
  add_variable(name, &detail::VariableAccess::state(v), std::any(v), std::move(t));
}

template <class T>
void CheckpointManager::track(const std::string& name, optimizers::Optimizer<T>& o) {
  using Access = detail::OptimizerAccess;
  // The tracked variables of the optimizer's element type, with the file names of their slots.
  auto candidates = [this, name, &o] {
    std::vector<std::pair<Variable<T>, std::vector<std::string>>> out;
    for (const auto& [var_name, tv] : variables_) {
      const auto* v = std::any_cast<Variable<T>>(&tv.handle);
      if (!v) continue;
      std::vector<std::string> keys;
      for (const auto& slot : Access::slot_names(o)) keys.push_back(name + "/" + var_name + "/" + slot);
      out.emplace_back(*v, std::move(keys));
    }
    return out;
  };
  auto require_tracked = [this, name, &o](const char* op) {
    for (const auto& s : Access::slots(o))
      if (!tracked_variable_name(s.variable)) throw_untracked_slot(name, s.slot.name(), op);
  };
  detail::CheckpointTrackable t;
  t.kind = "optimizer";
  t.save = [this, name, &o, require_tracked](TensorMap& out) {
    require_tracked("save");
    // In the file's (name) order, the same on every worker: sharded slots are gathered.
    std::map<std::string, Variable<T>> named;
    for (const auto& s : Access::slots(o))
      named.emplace(name + "/" + *tracked_variable_name(s.variable) + "/" + s.slot_name, s.slot);
    for (const auto& [key, slot] : named) add_tensor(out, key, VariableRef(slot).read(), "optimizer '" + name + "'");
    const std::optional<Variable<int64_t>> it = Access::iterations(o);
    add_tensor(out, name + "/iterations", it ? VariableRef(*it).read() : untyped(Tensor<int64_t>::scalar(0)),
               "optimizer '" + name + "'");
  };
  t.check = [name, &o, candidates, require_tracked](const Checkpoint& ckpt, std::set<std::string>& claimed) {
    require_tracked("restore_or_initialize");
    ckpt.check(name + "/iterations", DType::int64, {});
    claimed.insert(name + "/iterations");
    for (const auto& [var, keys] : candidates()) {
      bool in_file = false;
      for (const auto& key : keys) in_file = in_file || ckpt.contains(key);
      // A variable the optimizer has no slots for, and the file neither: one it does not train.
      if (!in_file && !Access::has_slots(o, var)) continue;
      for (const auto& key : keys) {
        ckpt.check(key, dtype_of<T>(), var.shape());
        claimed.insert(key);
      }
    }
  };
  t.prepare = [this, name, &o, candidates](const Checkpoint& ckpt) {
    std::vector<Variable<T>> fresh;
    std::vector<std::pair<Variable<T>, std::vector<std::string>>> restored;
    for (auto& [var, keys] : candidates()) {
      if (keys.empty() || !ckpt.contains(keys.front())) continue;
      if (!Access::has_slots(o, var)) fresh.push_back(var);
      restored.emplace_back(var, keys);
    }
    {
      // Made as the first update would make them: in the strategy's scope (zeros, then assigned).
      const Scope scope = strategy_.scope();
      o.build(fresh);
    }
    std::vector<std::function<void()>> commits;
    const auto slot_names = Access::slot_names(o);
    for (const auto& [var, keys] : restored)
      for (std::size_t k = 0; k < keys.size(); ++k)
        commits.push_back(VariableRef(o.get_slot(var, slot_names[k])).prepare_write(ckpt.at(keys[k])));
    commits.push_back(VariableRef(*Access::iterations(o)).prepare_write(ckpt.at(name + "/iterations")));
    return detail::CheckpointRestoreStep{[commits = std::move(commits)] {
                                           for (const auto& c : commits) c();
                                         },
                                         {}};
  };
  add(name, std::move(t));
}

template void CheckpointManager::track(const std::string&, Variable<float>&);
template void CheckpointManager::track(const std::string&, Variable<double>&);
template void CheckpointManager::track(const std::string&, Variable<int32_t>&);
template void CheckpointManager::track(const std::string&, Variable<int64_t>&);
template void CheckpointManager::track(const std::string&, Variable<uint8_t>&);
template void CheckpointManager::track(const std::string&, Variable<float16>&);
template void CheckpointManager::track(const std::string&, Variable<bfloat16>&);
template void CheckpointManager::track(const std::string&, optimizers::Optimizer<float>&);
template void CheckpointManager::track(const std::string&, optimizers::Optimizer<double>&);

}  // namespace mirrored::checkpoint
