#pragma once
// Private: which replica the calling thread works for. The runtime knows (its replica contexts,
// the lanes that act for a replica); the device backends ask (to name the replica in messages, and
// to raise what a kernel found only in that replica). Neither layer depends on the other for it,
// and no backend is involved, so it lives below both.

namespace mirrored::detail {

/// The calling thread's replica id in its sync group, or -1 outside a replica.
using ReplicaIdSource = int (*)() noexcept;
/// Registers what `calling_replica_id` asks: the runtime, which owns the replica contexts, does
/// this once (the layers below read no runtime state). Until then, and with nullptr, no thread is
/// in a replica.
void set_replica_id_source(ReplicaIdSource source) noexcept;

/// The replica the calling thread works for: the innermost ActingReplicaScope's, else the
/// registered source's answer; -1 outside any replica.
int calling_replica_id() noexcept;

/// While it lives, the calling thread (a thread of the library, such as an asynchronous
/// collective's lane) works for replica `replica` (its id in the sync group): messages name it and
/// the errors its kernels find are that replica's. Destroy it on the constructing thread.
class ActingReplicaScope {
 public:
  explicit ActingReplicaScope(int replica) noexcept;
  ~ActingReplicaScope();
  ActingReplicaScope(const ActingReplicaScope&) = delete;
  ActingReplicaScope& operator=(const ActingReplicaScope&) = delete;

 private:
  int outer_;
};

}  // namespace mirrored::detail
