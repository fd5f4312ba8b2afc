// Thread-local context: which strategy and which replica context the calling thread is in.
#include "mirrored/replica_context.hpp"
#include "runtime/default_strategy.hpp"

namespace mirrored {
namespace detail {

ThreadState& thread_state() noexcept {
  thread_local ThreadState state;
  return state;
}

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
