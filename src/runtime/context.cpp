// Thread-local context: which strategy and which replica context the calling thread is in.
#include "mirrored/replica_context.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/thread_state.hpp"
#include "util/calling_replica.hpp"

namespace mirrored {
namespace detail {

ThreadState& thread_state() noexcept {
  thread_local ThreadState state;
  return state;
}

bool in_replica_thread() noexcept { return thread_state().replica != nullptr; }

namespace {
int current_replica_id() noexcept {
  const ReplicaContext* ctx = thread_state().replica;
  return ctx ? ctx->replica_id_in_sync_group() : -1;
}
// The device layer names the calling replica in its GPU messages; it knows no replica contexts, so
// the runtime tells it where to ask, before main (its slot is constant-initialised).
[[maybe_unused]] const bool replica_id_source_registered = (set_replica_id_source(&current_replica_id), true);
}  // namespace

DefaultStrategy::DefaultStrategy() : Strategy({cpu0}, nullptr) {}

DefaultStrategy& default_strategy() {
  static DefaultStrategy s;
  return s;
}

bool is_default_context(const ReplicaContext* ctx) noexcept {
  return ctx && &ctx->strategy() == static_cast<Strategy*>(&default_strategy());
}

}  // namespace detail

Strategy& get_strategy() {
  auto& ts = detail::thread_state();
  if (ts.replica) return ts.replica->strategy();
  if (ts.merge) return *ts.merge;
  if (!ts.scopes.empty()) return *ts.scopes.back();
  return detail::default_strategy();
}

bool has_strategy() { return &get_strategy() != static_cast<Strategy*>(&detail::default_strategy()); }

bool in_cross_replica_context() {
  auto& ts = detail::thread_state();
  if (ts.replica) return false;
  return ts.merge != nullptr || !ts.scopes.empty();
}

ReplicaContext* get_replica_context() {
  auto& ts = detail::thread_state();
  if (ts.replica) return ts.replica;
  if (in_cross_replica_context()) return nullptr;
  return &detail::default_strategy().default_context();
}

}  // namespace mirrored
