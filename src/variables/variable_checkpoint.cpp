#include "mirrored/variable_checkpoint.hpp"

#include <functional>
#include <vector>

#include "runtime/default_strategy.hpp"
#include "runtime/thread_state.hpp"

namespace mirrored::checkpoint {
namespace {

void require_cross_replica(const char* op) {
  const auto& ts = detail::thread_state();
  MIRRORED_ENFORCE(!ts.replica || detail::is_default_context(ts.replica), FailedPreconditionError, "checkpoint::", op,
                   " called on replica ", ts.replica ? ts.replica->replica_id_in_sync_group() : 0,
                   " inside run; save and restore in cross-replica context (outside run)");
}

}  // namespace

void save(const std::string& path, const VariableMap& variables, const Metadata& metadata) {
  require_cross_replica("save");
  TensorMap tensors;
  for (const auto& [name, ref] : variables) tensors.emplace(name, ref.read());
  save_tensors(path, tensors, metadata);
}

void restore(const std::string& path, const VariableMap& variables) {
  require_cross_replica("restore");
  const Checkpoint ckpt = load(path);
  for (const auto& [name, ref] : variables) ckpt.check(name, ref.dtype(), ref.shape());
  // Everything that can fail (a variable of another or a destroyed strategy, a device copy)
  // happens in phase one, for every variable, before the first one changes.
  std::vector<std::function<void()>> commits;
  commits.reserve(variables.size());
  for (const auto& [name, ref] : variables) commits.push_back(ref.prepare_write(ckpt.at(name)));
  for (const auto& commit : commits) commit();
}

}  // namespace mirrored::checkpoint
