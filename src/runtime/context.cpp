// Thread-local context: which strategy and which replica context the calling thread is in.
#include <utility>

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

namespace {
thread_local const Device* scoped_device = nullptr;  // the innermost DefaultDeviceScope's
}  // namespace

detail::DefaultDeviceScope::DefaultDeviceScope(const Device& device) noexcept
    : device_(device), previous_(std::exchange(scoped_device, &device_)) {}

detail::DefaultDeviceScope::~DefaultDeviceScope() { scoped_device = previous_; }

const Device& default_device() noexcept {
  if (scoped_device) return *scoped_device;
  const ReplicaContext* ctx = detail::thread_state().replica;
  if (!ctx || detail::is_default_context(ctx)) return cpu0;
  const auto& devices = ctx->strategy().extended().worker_devices();
  const auto r = static_cast<std::size_t>(detail::local_replica_index(*ctx));
  return r < devices.size() ? devices[r] : cpu0;
}

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
