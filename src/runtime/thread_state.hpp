#pragma once
// Private: which context the calling thread is in — the state behind TF's context rules
// (`get_strategy`, `in_cross_replica_context`, "Mixing different tf.distribute.Strategy objects").
// Set by the runtime as a thread enters a scope, a replica's function or a merge_fn; read by the
// runtime and the variables above it (the public headers see only `detail::in_replica_thread`).

#include <vector>

namespace mirrored {

class ReplicaContext;
class Strategy;

namespace detail {

struct ThreadState {
  ReplicaContext* replica = nullptr;  // inside Strategy::run on a replica thread
  Strategy* merge = nullptr;          // inside a merge_fn (cross-replica context)
  std::vector<Strategy*> scopes;      // scopes entered on this thread, innermost last
};
ThreadState& thread_state() noexcept;

}  // namespace detail
}  // namespace mirrored
