// Which replica the calling thread works for.
#include "util/calling_replica.hpp"

#include <atomic>

namespace mirrored::detail {
namespace {

// Constant-initialised, so that the runtime may register its source before main.
constinit std::atomic<ReplicaIdSource> replica_id_source{nullptr};

// The replica a library thread (an asynchronous collective's lane) acts for, -1 when none.
thread_local int tl_acting_replica = -1;

}  // namespace

int calling_replica_id() noexcept {
  if (tl_acting_replica >= 0) return tl_acting_replica;
  const ReplicaIdSource source = replica_id_source.load(std::memory_order_acquire);
  return source ? source() : -1;
}

ActingReplicaScope::ActingReplicaScope(int replica) noexcept : outer_(tl_acting_replica) {
  tl_acting_replica = replica;
}

ActingReplicaScope::~ActingReplicaScope() { tl_acting_replica = outer_; }

void set_replica_id_source(ReplicaIdSource source) noexcept {
  replica_id_source.store(source, std::memory_order_release);
}

}  // namespace mirrored::detail
